"""experiments/learn.py's reuse of a base evaluation: only under the same conditions."""

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from experiments import learn
from ragen import config
from ragen.rollout.loop import EVAL_SEED_BASE
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer

BASE = {"sokoban": {"success": 0.1016, "format_ok": 0.975, "reward_mean": 0.21, "seconds": 1.0}}


def fingerprint(*overrides: str, n: int = 256, temperature: float = 0.5) -> dict:
    """The sokoban preset evaluated on sokoban alone (as the README's learn runs are)."""
    cfg = config.load("sokoban-rl", ["env.eval_names=[sokoban]", *overrides])
    return learn.eval_fingerprint(cfg, n, temperature)


def saved_run(tmp_path: Path, fp: dict) -> Path:
    (tmp_path / learn.BASE_FILE).write_text(json.dumps({"fingerprint": fp, "base": BASE}))
    return tmp_path


def test_training_settings_leave_the_fingerprint_alone():
    # What only the updates or the training rollouts use cannot move the base evaluation.
    same = fingerprint(
        "trainer.actor_lr=5e-5",
        "algo.estimator=grpo",
        "rollout.temperature=0.7",
        "model.critic_layers=4",
    )
    assert same == fingerprint()


def test_a_base_saved_with_the_critics_shape_is_reused_by_a_run_with_another(tmp_path):
    # Fingerprints saved before the critic's keys were left out hold model.critic_layers.
    fp = fingerprint()
    older = {**fp, "model": {**fp["model"], "critic_layers": None}}
    assert learn.load_base(saved_run(tmp_path, older), fingerprint("model.critic_layers=4")) == BASE


@pytest.mark.parametrize(
    ("overrides", "n", "temperature", "key"),
    [
        (["rollout.max_reply_tokens=64"], 256, 0.5, "rollout"),
        (["env.eval_names=[sokoban,frozen-lake]"], 256, 0.5, "env"),
        (["trainer.seed=1"], 256, 0.5, "sample_seed"),
        (["model.dtype=bfloat16"], 256, 0.5, "model"),
        ([], 64, 0.5, "eval_n"),
        ([], 256, 1.0, "temperature"),
    ],
)
def test_what_the_evaluation_depends_on_changes_it(overrides, n, temperature, key):
    theirs = fingerprint(*overrides, n=n, temperature=temperature)
    ours = fingerprint()
    assert [k for k in ours if ours[k] != theirs[k]] == [key]


def test_a_base_evaluation_is_reused_from_a_run_dir_or_its_file(tmp_path):
    fp = fingerprint()
    run = saved_run(tmp_path, fp)
    assert learn.load_base(run, fp) == BASE
    assert learn.load_base(run / learn.BASE_FILE, fp) == BASE


def test_one_measured_under_other_conditions_is_refused_with_what_differs(tmp_path):
    run = saved_run(tmp_path, fingerprint("rollout.max_reply_tokens=64", n=64))
    with pytest.raises(SystemExit, match=r"differs in: eval_n, rollout\).*without --base-from"):
        learn.load_base(run, fingerprint())


def test_one_from_other_code_is_refused(tmp_path):
    fp = fingerprint()
    run = saved_run(tmp_path, {**fp, "source_sha256": "0" * 64})
    with pytest.raises(SystemExit, match=r"differs in: source_sha256\)"):
        learn.load_base(run, fp)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"fingerprint": {"eval_n": 2', "Expecting"),  # torn by a killed writer
        ('{"base": {}}', "'fingerprint'"),
        ('{"base": [], "fingerprint": {}}', "must be objects"),
        ('{"base": {"sokoban": 0.1}, "fingerprint": {}}', "lacks a numeric success"),
        ('{"base": {"sokoban": {"success": "10%"}}, "fingerprint": {}}', "lacks a numeric"),
    ],
)
def test_a_file_that_is_no_base_evaluation_is_refused(tmp_path, text, why):
    (tmp_path / learn.BASE_FILE).write_text(text)
    with pytest.raises(SystemExit, match=f"is not a base evaluation.*{why}"):
        learn.load_base(tmp_path, fingerprint())


def test_one_without_every_eval_env_is_refused(tmp_path):
    fp = fingerprint("env.eval_names=[sokoban,sokoban-large,frozen-lake]")
    run = saved_run(tmp_path, fp)  # holds sokoban's numbers only
    with pytest.raises(SystemExit, match=r"differs in: base lacks sokoban-large, base lacks fro"):
        learn.load_base(run, fp)


def test_a_missing_file_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="does not exist; run without --base-from"):
        learn.load_base(tmp_path, fingerprint())


def test_each_evaluation_keeps_its_episodes_and_its_full_summary(tmp_path):
    tiny = ["model.spec=tiny", "env.eval_names=[sokoban]", "rollout.max_reply_tokens=6"]
    cfg = config.load("sokoban-rl", [*tiny, "logging.progress=false", "logging.tensorboard=false"])
    run = RunDir(tmp_path / "run")
    create_run_dir(run.root, cfg)
    out = run.root / "eval-base"
    summary = learn.evaluate_all(Trainer(cfg), 3, 0.5, out)["sokoban"]
    episodes = read_jsonl(out / "trajectories" / "eval.jsonl").records
    assert [e["seed"] for e in episodes] == [EVAL_SEED_BASE, EVAL_SEED_BASE + 1, EVAL_SEED_BASE + 2]
    assert summary["episodes"] == 3 and summary["temperature"] == 0.5
    assert summary["success"] == sum(e["success"] for e in episodes) / 3
    assert summary["turns_mean"] == sum(e["num_turns"] for e in episodes) / 3
    (saved,) = read_jsonl(out / "eval.jsonl").records
    assert saved == {"model": "eval-base", **summary}


def _ctrl_c():
    raise KeyboardInterrupt


def _kill():
    os.kill(os.getpid(), signal.SIGTERM)


# SIGTERM's handler raises KeyboardInterrupt, so the kill takes Ctrl-C's path and more: the
# Ctrl-C case runs with -m slow.
@pytest.mark.parametrize(
    "stop",
    [pytest.param(_ctrl_c, id="_ctrl_c", marks=pytest.mark.slow), pytest.param(_kill, id="_kill")],
)
def test_a_run_stopped_with_ctrl_c_or_kill_is_recorded_without_a_final_evaluation(
    tmp_path, monkeypatch, capsys, stop
):
    train = RunLoop.train
    handler = signal.getsignal(signal.SIGTERM)

    def one_step_then_stop(self):
        train(self)
        stop()

    monkeypatch.setattr(learn.RunLoop, "train", one_step_then_stop)
    monkeypatch.setattr(learn, "RESULTS", tmp_path / "results")
    overrides = ["model.spec=tiny", "env.eval_names=[sokoban]", "rollout.max_reply_tokens=6"]
    overrides += ["rollout.groups=2", "rollout.group_size=2", "trainer.steps=1"]
    overrides += ["trainer.mini_batch_size=2", "trainer.micro_batch_size=2"]
    overrides += ["logging.progress=false", "trainer.eval_episodes=2"]
    argv = ["learn.py", "sokoban", "--eval-n", "2", "--name", "probe", *overrides]
    monkeypatch.setattr("sys.argv", [*argv, "--out", str(tmp_path / "run")])
    learn.main()
    assert "stopped after 1 steps" in capsys.readouterr().out
    result = json.loads((tmp_path / "results" / "learn_probe_stopped.json").read_text())
    assert result["final"] is None and result["steps"] == 1
    assert result["stopped"].startswith("interrupted during training")
    assert result["base"]["sokoban"]["episodes"] == 2
    # the per-step record the collapse detector is calibrated on: 2 groups of 2 episodes
    columns = result["per_step"]["columns"]
    assert columns["step"] == [0] and columns["rollout/episodes"] == [4.0]
    assert 0 <= columns["rollout/success"][0] <= 1 and result["per_step"]["alerts"] == []
    assert not (tmp_path / "run" / "eval-final").exists()
    assert result["report"] == str(tmp_path / "run" / "report")
    summary = (tmp_path / "run" / "report" / "summary.md").read_text()
    assert "| sokoban |" in summary and "| — |" in summary and "Stopped: interrupted" in summary
    assert signal.getsignal(signal.SIGTERM) == handler  # the handler is put back


def test_the_change_is_measured_in_standard_errors_of_the_difference():
    # 10% -> 20% on 256 seeds each: SE = sqrt((0.1·0.9 + 0.2·0.8) / 256) = 0.5 / 16.
    c = learn.change(0.1, 0.2, 256)
    assert c["difference"] == pytest.approx(0.1) and c["se"] == pytest.approx(0.03125)
    assert c["z"] == pytest.approx(3.2)
    assert learn.change(0.5, 0.5, 200) == {"difference": 0.0, "se": 0.05, "z": 0.0}
    assert learn.change(0.0, 0.0, 64)["z"] == 0.0
    assert learn.change(0.0, 1.0, 64)["z"] is None  # no spread to measure against


def test_a_fingerprint_saved_before_a_config_key_existed_is_still_this_ones(tmp_path):
    # env.eval_options came later; a base evaluated before it held its default's behaviour.
    fp = fingerprint()
    older = {**fp, "env": {k: v for k, v in fp["env"].items() if k != "eval_options"}}
    assert learn.load_base(saved_run(tmp_path, older), fp) == BASE
    changed = {**older, "env": {**older["env"], "options": {"spaced": True}}}
    with pytest.raises(SystemExit, match=r"differs in: env\)"):
        learn.load_base(saved_run(tmp_path, changed), fp)


# The run's own evaluation after its last step plays 2 episodes (learn.py's are --eval-n)
TINY_RUN = [
    *["model.spec=tiny", "env.eval_names=[sokoban]", "rollout.max_reply_tokens=6"],
    "trainer.eval_episodes=2",
    *["rollout.groups=2", "rollout.group_size=2", "trainer.mini_batch_size=2"],
    *["trainer.micro_batch_size=2", "logging.progress=false", "trainer.save_every=1"],
]


def test_a_resumed_run_counts_every_step_and_minute_against_its_own_base(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(learn, "RESULTS", tmp_path / "results")
    run = tmp_path / "run"
    learn.main(["sokoban", *TINY_RUN, "trainer.steps=1", "--eval-n", "2", "--out", str(run)])
    first = json.loads((tmp_path / "results" / "learn_sokoban.json").read_text())
    assert json.loads((run / learn.RESULT_FILE).read_text()) == first
    with pytest.raises(SystemExit) as e:  # another preset than the run's
        learn.main(["bandit", "--resume", str(run), "--name", "longer", "--eval-n", "2"])
    assert "trained preset 'sokoban', not 'bandit'" in capsys.readouterr().err, e.value
    learn.main(["--resume", str(run), "trainer.steps=2", "--eval-n", "2", "--name", "longer"])
    result = json.loads((tmp_path / "results" / "learn_longer.json").read_text())
    assert result["steps"] == 2 and len(read_jsonl(run / "metrics.jsonl").records) == 2
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl").records] == [0, 1]
    assert result["base"] == first["base"] and result["preset"] == "sokoban"
    assert result["train_minutes"] >= first["train_minutes"]
    assert result["resumed"] == {
        k: first[k] for k in ("command", "steps", "train_minutes", "final")
    }
    assert result["command"].endswith(f"--name longer --eval-n 2 --temperature 0.5 --resume {run}")
    (saved,) = read_jsonl(run / "eval-step_000002" / "eval.jsonl").records
    assert saved["episodes"] == 2 and result["final"]["sokoban"]["episodes"] == 2
    assert (run / "eval-final").is_dir()  # the first final evaluation is kept
    assert (run / "report" / "summary.md").is_file()


def test_a_run_that_dies_while_training_is_resumed_with_the_minutes_it_trained(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(learn, "RESULTS", tmp_path / "results")
    train = RunLoop.train

    def one_step_then_die(self):  # what a kill or a full disk looks like from learn.py
        train(self)
        raise OSError("No space left on device")

    monkeypatch.setattr(learn.RunLoop, "train", one_step_then_die)
    run = tmp_path / "run"
    with pytest.raises(OSError):
        learn.main(["sokoban", *TINY_RUN, "trainer.steps=1", "--eval-n", "2", "--out", str(run)])
    died = json.loads((run / learn.RESULT_FILE).read_text())
    assert died["final"] is None and died["steps"] == 0 and died["train_minutes"] == 0.0
    assert died["stopped"].startswith("training did not end")
    (logged,) = read_jsonl(run / "metrics.jsonl").records
    trained = (logged["time"] - died["training_started"]) / 60
    assert trained > 0
    monkeypatch.setattr(learn.RunLoop, "train", train)
    learn.main(["--resume", str(run), "trainer.steps=2", "--eval-n", "2", "--name", "again"])
    result = json.loads((tmp_path / "results" / "learn_again.json").read_text())
    assert result["steps"] == 2 and result["resumed"]["train_minutes"] == pytest.approx(trained)
    assert result["train_minutes"] > trained and result["final"]["sokoban"]["episodes"] == 2
    assert json.loads((run / learn.RESULT_FILE).read_text()) == result


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--resume", "R"], "name it with --name"),
        (["--resume", "R", "--name", "x", "--out", "o"], "drop --out, --base-from and --sft"),
        (["--resume", "R", "--name", "x", "--sft"], "drop --out, --base-from and --sft"),
        (["--name", "x"], "name a preset"),
        (["sokoban", "--name", "a b"], "letters, digits, - and _ only"),
    ],
)
def test_a_resume_or_name_the_script_cannot_take_is_a_usage_error(argv, why, capsys):
    with pytest.raises(SystemExit):
        learn.parse_args(argv)
    assert why in capsys.readouterr().err


def test_a_resume_of_a_run_learn_py_did_not_make_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path} holds no learn.json: no learn.py run"):
        learn.main(["--resume", str(tmp_path), "--name", "x"])


def test_trainer_threads_sets_the_thread_count_of_the_whole_run(tmp_path, monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr("sys.argv", ["learn.py", "sokoban", "model.spec=tiny", "trainer.threads=1"])
    args = learn.parse_args(None)
    args.stamp, args.out = "now", str(tmp_path / "run")
    try:
        cfg, *_ = learn.prepare(args)
        assert cfg.trainer.threads == 1 and torch.get_num_threads() == 1
        # ... which the base evaluation's fingerprint records
        assert learn.eval_fingerprint(cfg, 2, 0.5)["torch_threads"] == 1
    finally:
        torch.set_num_threads(before)


def test_the_paired_change_reads_only_the_seeds_whose_outcome_changed():
    # 8 seeds: 3 went from failure to success, 1 the other way, 4 kept their outcome
    before = dict.fromkeys(range(8), False) | {5: True, 6: True, 7: True}
    after = {0: True, 1: True, 2: True, 3: False, 4: False, 5: False, 6: True, 7: True}
    paired = learn.paired_change(before, after)
    # differences +1 ×3, -1 ×1, 0 ×4: mean 2/8; sample variance (4 - 8 × 0.25²) / 7 = 3.5 / 7
    assert (paired["seeds"], paired["gained"], paired["lost"]) == (8, 3, 1)
    assert paired["difference"] == 0.25
    assert paired["se"] == pytest.approx((0.5 / 8) ** 0.5)
    assert paired["z"] == pytest.approx(0.25 / (0.5 / 8) ** 0.5)
    assert learn.paired_change(before, before)["z"] == 0.0
    assert (
        learn.paired_change(dict.fromkeys(range(4), False), dict.fromkeys(range(4), True))["z"]
        is None
    )  # every seed gained: no spread to measure against
    assert learn.paired_change({1: True}, {2: True}) is None  # no seed in common


def test_seed_successes_reads_an_evaluation_folder_and_skips_a_torn_last_line(tmp_path):
    folder = tmp_path / "eval-base"
    (folder / "trajectories").mkdir(parents=True)
    lines = [
        {"env": "frozen-lake", "copy": 0, "seed": 7, "success": True},
        {"env": "frozen-lake", "copy": 1, "seed": 7, "success": False},  # a pass@k copy
        {"env": "sokoban", "copy": 0, "seed": 7, "success": False},
        {"env": "frozen-lake", "copy": 0, "seed": 9, "success": False},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"env": "froz'
    (folder / "trajectories" / "eval.jsonl").write_text(text)
    assert learn.seed_successes(folder, "frozen-lake") == {7: True, 9: False}
    assert learn.seed_successes(folder, "bandit") is None
    assert learn.seed_successes(tmp_path / "nowhere", "frozen-lake") is None
