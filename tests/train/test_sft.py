"""`ragen sft` on the tiny model: the supervised loss by hand, the run it writes, exact
resume, and RL started from its checkpoint."""

import json
import math

import pytest
import torch

from ragen import config, models
from ragen.cli import main
from ragen.rollout.expert import expert_dialogues
from ragen.rollout.loop import RolloutSpec
from ragen.rollout.trajectory import collate
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir
from ragen.train.sft import supervised_update

# Dialogues of up to two turns without worked demonstrations: the shortest rows that still
# hold several replies, each with its own loss tokens.
SHORT = ["rollout.demos=0", "rollout.max_turns=2"]

RL = ["--preset", "sokoban-rl"]
"""The game these runs imitate: the sokoban-rl preset's, whose expert plays shortest solutions
(the sokoban preset's push rule has tests of its own, tests/envs/test_sokoban_push.py)."""

SMALL = [
    "model.spec=tiny",
    *SHORT,
    "sft.dialogues=4",
    "sft.micro_batch_size=2",
    "sft.lr=1e-3",
    "trainer.eval_episodes=2",
    "env.eval_names=[sokoban]",
    "rollout.max_reply_tokens=64",
    "logging.progress=false",
    "logging.tensorboard=false",
]


def _batch(tokenizer, seeds=(0, 1, 2)):
    c = config.load("sokoban-rl", SHORT)
    spec = RolloutSpec.from_config(c.rollout)
    return collate(expert_dialogues(tokenizer, "sokoban", list(seeds), spec), 0)


def _masked_nll(model, batch) -> torch.Tensor:
    """Token-mean NLL of the masked tokens from a plain forward (no shared prefix): the
    decoder over every token, the LM head and log-softmax at the masked positions only (the
    others weigh nothing)."""
    ids, attention = batch.input_ids, batch.attention_mask
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
    mask = batch.loss_mask[:, 1:].bool()
    logits = model.get_output_embeddings()(hidden[:, :-1][mask])  # (masked tokens, vocab)
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, ids[:, 1:][mask][:, None]).mean()


def _nll_by_hand(model, batch) -> float:
    with torch.no_grad():
        return float(_masked_nll(model, batch))


def _step_by_hand(batch) -> torch.Tensor:
    """The weights after one SGD step (lr 0.1) on the NLL of a plain full forward of the
    whole batch (no shared opening, no micro-batches), flattened."""
    model, _ = models.load_policy("tiny", dtype="float32", seed=0)
    _masked_nll(model, batch).backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_supervised_loss_is_the_token_mean_nll_of_the_replies_for_any_micro_batch():
    # the opening run once for the batch, micro-batches of 1 to 3 rows: the whole batch's step
    model, tokenizer = models.load_policy("tiny", dtype="float32", seed=0)
    batch = _batch(tokenizer)
    expected = _nll_by_hand(model, batch)  # every model below starts from these weights
    want = _step_by_hand(batch)
    for micro in (1, 2, 3):
        model, _ = models.load_policy("tiny", dtype="float32", seed=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        metrics = supervised_update(model, optimizer, batch, micro_batch_size=micro, grad_clip=1e9)
        assert metrics["sft/loss"] == pytest.approx(expected, rel=1e-5)
        assert metrics["sft/reply_tokens"] == float(batch.loss_mask.sum())
        assert metrics["sft/skipped"] == 0.0
        updated = torch.cat([p.detach().flatten() for p in model.parameters()])
        assert torch.allclose(updated, want, atol=1e-6)
    assert _nll_by_hand(model, batch) < expected  # the step (each one above) lowers the loss


def test_supervised_update_runs_its_forwards_under_autocast():
    model, tokenizer = models.load_policy("tiny", dtype="float32", seed=0)
    batch = _batch(tokenizer)
    expected = _nll_by_hand(model, batch)
    seen: list[torch.dtype] = []
    mlp = model.get_decoder().layers[0].mlp.down_proj
    hook = mlp.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = supervised_update(
        model, optimizer, batch, micro_batch_size=2, grad_clip=1e9, autocast_dtype=torch.bfloat16
    )
    hook.remove()
    # the opening's forward, then one per micro-batch of 2 rows, every one in bf16
    assert seen == [torch.bfloat16] * (1 + math.ceil(len(batch.input_ids) / 2))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the master weights
    assert metrics["sft/loss"] == pytest.approx(expected, rel=2e-2)  # bf16 rounding only
    assert _nll_by_hand(model, batch) < expected


def test_non_finite_gradient_skips_the_step():
    model, tokenizer = models.load_policy("tiny", dtype="float32", seed=0)
    batch = _batch(tokenizer, seeds=(0,))
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        model.get_output_embeddings().weight[0, 0] = float("nan")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = supervised_update(model, optimizer, batch, micro_batch_size=1, grad_clip=1.0)
    assert metrics["sft/skipped"] == 1.0
    changed = [
        n for (n, p), b in zip(model.named_parameters(), before, strict=True) if not p.equal(b)
    ]
    assert changed == ["lm_head.weight"] or changed == ["model.embed_tokens.weight"]


def test_a_run_whose_updates_are_all_skipped_stops_in_one_line(tmp_path, capsys):
    model, tokenizer = models.load_policy("tiny", dtype="float32", seed=0)
    with torch.no_grad():  # every loss is NaN from here: no update can ever be taken
        model.get_output_embeddings().weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "nan")
    tokenizer.save_pretrained(tmp_path / "nan")
    argv = [*SMALL, f"model.spec={tmp_path / 'nan'}", "sft.steps=6", "trainer.eval_episodes=1"]
    assert main(["sft", "sokoban", *RL, *argv, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "ragen: stopped: [step 2] every update of the last 3 steps was skipped: the loss or its "
        "gradient was not finite (a sft.lr too large, or weights that are not finite); start a "
        "new run, or resume from a checkpoint before the trouble"
    )
    records = read_jsonl(RunDir(tmp_path / "run").metrics).records
    assert [r["sft/skipped"] for r in records] == [1.0, 1.0, 1.0]


def _sft(tmp_path, name, *overrides, resume=False):
    args = ["sft", "--resume", str(tmp_path / name)] if resume else ["sft", "sokoban", *RL]
    out = [] if resume else ["--out", str(tmp_path / name)]
    return main([*args, *([] if resume else SMALL), *overrides, *out])


def _sft_records(run):
    return [
        {k: v for k, v in r.items() if k.startswith("sft/")}
        for r in read_jsonl(RunDir(run).metrics).records
    ]


def test_sft_writes_a_run_that_resumes_exactly_and_rl_starts_from(tmp_path, capsys):
    assert _sft(tmp_path, "whole", "sft.steps=3", "trainer.save_every=1") == 0
    whole = _sft_records(tmp_path / "whole")
    assert len(whole) == 3 and whole[-1]["sft/loss"] < whole[0]["sft/loss"]
    assert all(r["sft/dialogues"] == 4 and r["sft/expert_success"] == 1.0 for r in whole)
    evals = read_jsonl(RunDir(tmp_path / "whole").evals).records
    assert [e["step"] for e in evals] == [2]  # sft.eval_every=0: after the last step only
    episodes = (tmp_path / "whole" / "trajectories" / "step_000000.jsonl").read_text()
    assert all(json.loads(line)["success"] for line in episodes.splitlines())
    assert main(["report", str(tmp_path / "whole"), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "sft.png").stat().st_size > 0  # the loss curve

    assert _sft(tmp_path, "part", "sft.steps=2", "trainer.save_every=1") == 0
    assert _sft(tmp_path, "part", "sft.steps=3", resume=True) == 0
    assert _sft_records(tmp_path / "part") == whole
    saved = config.load(str(tmp_path / "part" / "config.yaml"))
    assert saved.sft.steps == 3
    ckpt = tmp_path / "whole" / "checkpoints" / "step_000003"
    weights = {}
    for run in ("whole", "part"):
        model, _ = models.load_policy(str(tmp_path / run / "checkpoints" / "step_000003"))
        weights[run] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.equal(weights["whole"], weights["part"])

    refused = main(["train", "--resume", str(tmp_path / "whole")])
    assert refused == 2 and "continue it with `ragen sft --resume" in capsys.readouterr().err
    rl = [
        "train",
        "sokoban-rl",
        f"model.spec={ckpt}",
        "trainer.steps=1",
        "rollout.groups=2",
        "rollout.group_size=2",
        "rollout.max_reply_tokens=6",
        "trainer.mini_batch_size=2",
        "trainer.micro_batch_size=2",
        "trainer.eval_every=0",
        "logging.progress=false",
        "logging.tensorboard=false",
        "--out",
        str(tmp_path / "rl"),
    ]
    assert main(rl) == 0
    assert config.load(str(tmp_path / "rl" / "config.yaml")).model.spec == str(ckpt)
    assert len(read_jsonl(RunDir(tmp_path / "rl").metrics).records) == 1
    assert main(["sft", "--resume", str(tmp_path / "rl")]) == 2
    assert "continue it with `ragen train --resume" in capsys.readouterr().err


def test_sft_learning_rate_decays_over_its_steps(tmp_path):
    assert _sft(tmp_path, "decay", "sft.steps=2", "trainer.lr_decay=linear") == 0
    assert [r["sft/lr"] for r in _sft_records(tmp_path / "decay")] == pytest.approx([1e-3, 5e-4])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sft"], "name an environment"),
        (["sft", "chess"], "unknown environment 'chess'"),
        (["sft", "sokoban", "sft.steps=0"], "sft.steps"),
        (["sft", "--resume", "nowhere", "sokoban"], "--resume continues a run"),
        (["sft", "--resume", "nowhere"], "is not a run directory"),
        (
            ["sft", "frozen-lake", "sft.lake_expert=sides", "env.options.slippery=false"],
            "sft.lake_expert=sides reasons about slips, and this lake is not slippery",
        ),
        (
            ["sft", "frozen-lake", "sft.lake_expert=ranked", "env.options.slippery=false"],
            "sft.lake_expert=ranked reasons about slips, and this lake is not slippery",
        ),
        (
            ["sft", "sokoban-large", "sft.sokoban_expert=push"],
            "sft.sokoban_expert=push plays rooms of one box, and env.options.num_boxes=2",
        ),
    ],
)
def test_bad_sft_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "run")] if "--resume" not in argv else argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_budget_no_level_fits_is_refused(tmp_path, capsys):
    argv = [
        "sokoban-large",  # two boxes: no level is solved in one action
        *RL,
        *SMALL,
        "rollout.max_actions_per_episode=1",
        "rollout.max_actions_per_turn=1",
    ]
    assert main(["sft", *argv, "--out", str(tmp_path / "run")]) == 2
    assert "the expert solved none of 32 levels" in capsys.readouterr().err


def test_a_resume_refuses_another_game_and_a_finished_one_writes_nothing(tmp_path, capsys):
    assert _sft(tmp_path, "run", "sft.steps=1") == 0
    run = RunDir(tmp_path / "run")
    saved, metrics = run.config.read_bytes(), run.metrics.read_bytes()
    capsys.readouterr()
    # the checkpoint imitated Sokoban's expert: its next step is no Bandit step
    assert _sft(tmp_path, "run", "sft.steps=2", "env.name=bandit", resume=True) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "env.name=bandit cannot apply to" in err[0]
    assert "trained with env.name=sokoban" in err[0]
    # nothing left to train: nothing trained, config.yaml keeps what the steps ran with
    assert _sft(tmp_path, "run", "sft.lr=0.5", resume=True) == 0
    assert "nothing left to train" in capsys.readouterr().out
    assert (run.config.read_bytes(), run.metrics.read_bytes()) == (saved, metrics)
    assert config.load(str(run.config)).sft.lr == 1e-3
