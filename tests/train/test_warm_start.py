"""`ragen train` with ``sft.warm_start`` on the tiny model: the `ragen sft` stage it runs in
RUN/warm_start, RL from that stage's last checkpoint, the budget split between them, a kill
in either stage resumed to the uninterrupted run's numbers, the report and the viewer."""

import json
from pathlib import Path

import pytest
import torch
from tests.small import NO_TENSORBOARD, TINY_RL

from ragen import config, models
from ragen.cli import main
from ragen.config import ConfigError
from ragen.run.jsonl import RunDirError, read_jsonl
from ragen.run.rundir import RunDir, read_stage_record
from ragen.train import warm_start
from ragen.train.checkpoint import complete_checkpoints
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer
from ragen.viewer.store import RunStore

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"

WARM = [
    "sokoban",
    *TINY_RL,
    NO_TENSORBOARD,
    "rollout.groups=2",
    "rollout.group_size=2",
    "rollout.max_reply_tokens=64",  # the expert's replies must fit
    "trainer.mini_batch_size=2",
    "trainer.eval_episodes=2",
    "env.eval_names=[sokoban]",
    "trainer.steps=2",
    "trainer.eval_every=2",  # RL evaluates after its last step
    "trainer.save_every=1",
    "sft.warm_start=true",
    "sft.steps=3",
    "sft.dialogues=4",
    "sft.micro_batch_size=2",
    "sft.lr=1e-3",
    # budgets no step here comes near, recorded as split
    "trainer.max_minutes=600",
    "sft.warm_start_minutes=200",
]


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def _stable(path):
    """A run's metrics without the timings, which differ from run to run."""
    records = read_jsonl(path).records
    return [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in records]


def _final_weights(run: RunDir) -> torch.Tensor:
    model, _ = models.load_policy(str(complete_checkpoints(run)[-1]), dtype="float32")
    return _flat(model)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """One uninterrupted warm-started run, and the RL policy's weights as its first step
    began: (its run directory, those weights)."""
    run = RunDir(tmp_path_factory.mktemp("warm") / "whole")
    first = []
    step = Trainer.step

    def noting_the_first_weights(self, number, state):
        if number == 0:
            first.append(_flat(self.m.policy))
        return step(self, number, state)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "step", noting_the_first_weights)
        assert main(["train", *WARM, "--out", str(run.root)]) == 0
    return run, first[0]


def test_rl_starts_from_the_warm_starts_last_checkpoint_within_one_budget(whole):
    run, first = whole
    stage = run.warm_start
    assert [r["step"] for r in read_jsonl(stage.metrics).records] == [0, 1, 2]
    assert [e["step"] for e in read_jsonl(stage.evals).records] == [2]  # after its last step
    last = stage.checkpoint(3)
    assert complete_checkpoints(stage)[-1] == last
    model, _ = models.load_policy(str(last), dtype="float32")
    assert torch.equal(first, _flat(model))  # RL's first step began from those weights
    assert [r["step"] for r in read_jsonl(run.metrics).records] == [0, 1]

    rl, sft = config.load_run(run.config), config.load_run(stage.config)
    assert rl.model.spec == str(last.resolve()) and not rl.sft.warm_start
    assert sft.model.spec == "tiny" and not sft.sft.warm_start  # a plain `ragen sft` run
    record = read_stage_record(stage)
    assert record is not None and record["steps"] == 3 and record["minutes"] > 0
    assert sft.trainer.max_minutes == 200  # the stage's own budget
    assert rl.trainer.max_minutes == record["rl_max_minutes"]
    assert rl.trainer.max_minutes == round(600 - record["minutes"], 3)  # what it left


def test_a_resume_cannot_turn_the_warm_start_on_again(whole, capsys):
    run, _ = whole
    assert main(["train", "--resume", str(run.root), "sft.warm_start=true"]) == 2
    err = capsys.readouterr().err
    assert "a resume cannot turn sft.warm_start on" in err and "drop the override" in err


def test_the_report_shows_the_warm_start_and_the_viewer_the_rl_run(whole, tmp_path):
    run, _ = whole
    assert main(["report", str(run.root), "--out", str(tmp_path / "report")]) == 0
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "Warm start (whole/warm_start): 3 steps of ragen sft in " in summary
    assert "| whole/warm_start | sokoban |" in summary  # its evaluation, a row of its own
    # RL's gain is read against the warm start's last evaluation: the policy RL started from
    assert "after the warm start, 0.0% after step 1" in summary
    assert (tmp_path / "report" / "sft.png").stat().st_size > 0  # its loss curve
    overview = RunStore(run.root).overview()
    assert overview["config"]["model"] == str(run.warm_start.checkpoint(3).resolve())
    assert [s["step"] for s in overview["steps"]] == [0, 1]
    assert RunStore(run.warm_start.root).overview()["steps"][-1]["step"] == 2


def _killed_after(monkeypatch, loop_name: str, step: int) -> None:
    """Ctrl-C right after ``loop_name`` (sft or train) saved the checkpoint of ``step``."""
    save = RunLoop.maybe_checkpoint

    def killed(self, number, last=False):
        save(self, number, last)
        if self.trainer.name == loop_name and number == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunLoop, "maybe_checkpoint", killed)


def test_a_kill_in_the_warm_start_resumes_it_exactly_then_trains(
    whole, tmp_path, monkeypatch, capsys
):
    run = RunDir(tmp_path / "killed")
    _killed_after(monkeypatch, "sft", 1)
    assert main(["train", *WARM, "--out", str(run.root)]) == 130
    assert f"continue with: ragen train --resume {run.root}" in capsys.readouterr().err
    assert config.load_run(run.config).sft.warm_start  # still to do
    assert read_stage_record(run.warm_start) is None
    assert complete_checkpoints(run.warm_start)[-1].name == "step_000002"
    assert not read_jsonl(run.metrics).records

    monkeypatch.undo()
    assert main(["train", "--resume", str(run.root)]) == 0
    done, _ = whole
    assert _stable(run.warm_start.metrics) == _stable(done.warm_start.metrics)
    assert _stable(run.metrics) == _stable(done.metrics)
    assert torch.equal(_final_weights(run), _final_weights(done))
    assert config.load_run(run.config).model.spec == str(run.warm_start.checkpoint(3).resolve())


def test_a_kill_in_rl_resumes_rl_without_redoing_the_warm_start(
    whole, tmp_path, monkeypatch, capsys
):
    run = RunDir(tmp_path / "killed")
    _killed_after(monkeypatch, "train", 0)
    assert main(["train", *WARM, "--out", str(run.root)]) == 130
    stage = run.warm_start
    files = [stage.metrics, stage.evals, stage.config, stage.stage_record]
    before = [f.read_bytes() for f in files]
    capsys.readouterr()

    monkeypatch.undo()
    assert main(["train", "--resume", str(run.root)]) == 0
    assert str(stage.root) not in capsys.readouterr().out  # no stage ran again
    assert [f.read_bytes() for f in files] == before
    done, _ = whole
    assert _stable(run.metrics) == _stable(done.metrics)
    assert torch.equal(_final_weights(run), _final_weights(done))


def test_the_budget_split():
    budget = ["trainer.max_minutes=30"]
    c = config.load("sokoban-rl", ["sft.warm_start=true", *budget])
    assert warm_start.stage_config(c).trainer.max_minutes == 30  # the whole budget caps it
    c = config.load("sokoban-rl", ["sft.warm_start=true", "sft.warm_start_minutes=10"])
    assert warm_start.stage_config(c).trainer.max_minutes == 10
    assert warm_start.rl_minutes(30, 12.25) == 17.75
    assert warm_start.rl_minutes(0, 12.25) == 0  # no budget: RL has none either
    assert warm_start.rl_minutes(30, 31) == warm_start.MIN_RL_MINUTES  # one step
    with pytest.raises(ConfigError, match="would leave RL no time"):
        config.load("sokoban-rl", ["sft.warm_start=true", *budget, "sft.warm_start_minutes=30"])


def test_the_opening_line_says_what_the_run_does_from_here(tmp_path):
    run = RunDir(tmp_path / "run")
    c = config.load("sokoban")  # the preset's own: an hour of the push rule, then 10 RL steps
    stage = warm_start.Stage(run.warm_start, warm_start.stage_config(c), resume=False)
    assert warm_start.opening_line(c, stage) == (
        f"warm start: `ragen sft` starts in {run.warm_start.root} (until 60 min or 3000 steps, "
        "whichever comes first), then 10 RL steps from its last checkpoint"
    )
    c = config.load("sokoban", ["sft.warm_start_minutes=0", "trainer.max_minutes=90"])
    stage = warm_start.Stage(run.warm_start, warm_start.stage_config(c), resume=True)
    assert warm_start.opening_line(c, stage) == (
        f"warm start: `ragen sft` resumes in {run.warm_start.root} (until 90 min or 3000 steps, "
        "whichever comes first), then 10 RL steps within trainer.max_minutes=90 from its last "
        "checkpoint"
    )
    c = config.load("sokoban", ["sft.warm_start_minutes=0", "sft.steps=4"])
    stage = warm_start.Stage(run.warm_start, warm_start.stage_config(c), resume=False)
    assert "(until 4 steps), then 10 RL steps" in warm_start.opening_line(c, stage)


def test_an_env_without_an_expert_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the maze: a user's env without an expert
    out = tmp_path / "run"
    argv = ["train", "bandit", "env.name=maze:MazeEnv", "sft.warm_start=true", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sft.warm_start=true but maze:MazeEnv has no expert" in err[0]
    assert "set sft.warm_start=false" in err[0]
    assert not out.exists()


def test_a_damaged_stage_record_is_refused_saying_how_to_record_it_again(tmp_path):
    stage = RunDir(tmp_path / "run").warm_start
    stage.root.mkdir(parents=True)
    stage.stage_record.write_text(json.dumps({"checkpoint": 3}))
    with pytest.raises(RunDirError, match=r"delete it, and ragen train --resume .*run records"):
        read_stage_record(stage)
