"""The run loop on the tiny model: the wall-clock budget, the collapse monitor's actions
(stop, roll back), and a loop that writes nothing until it is asked to."""

import json

import torch
from tests.train.test_trainer import _config, _train

from ragen.metric_names import REWARD_STD
from ragen.run.jsonl import append_jsonl, read_jsonl
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train import checkpoint
from ragen.train.loop import RunLoop, out_of_budget
from ragen.train.state import RunState
from ragen.train.trainer import Trainer, filter_ratio


def test_a_budget_ends_the_run_before_a_step_that_would_pass_it():
    # 3 steps in 90 s: a 4th at 30 s ends at 120 s.
    assert not out_of_budget(90.0, 3, 120.0)
    assert out_of_budget(90.0, 3, 119.9)
    assert out_of_budget(1.0, 0, 1.5)  # before any step: the elapsed time is the pace


def _files(root):
    return {p: p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def test_building_a_loop_writes_nothing_and_resume_is_asked_for(tmp_path):
    cfg = _config("trainer.steps=1")
    run = create_run_dir(tmp_path / "run", cfg)
    append_jsonl(run.metrics, [{"step": 0, "rollout/reward_mean": 0.0}])  # logged, not saved
    (run.checkpoints / ".step_000001.tmp").mkdir(parents=True)  # a write cut short
    before = _files(run.root)
    loop = RunLoop(Trainer(cfg), run)
    assert _files(run.root) == before and loop.start_step == 0
    assert loop.resume() == 0  # no checkpoint yet: the run starts again, its logs dropped
    assert read_jsonl(run.metrics).records == []
    assert not (run.checkpoints / ".step_000001.tmp").exists()


def _collapse_metrics(step):
    """A stream whose reward rises for 12 steps, then falls back to where it started."""
    reward = 0.1 + 0.05 * min(step, 12) - (0.08 * (step - 14) if step > 14 else 0.0)
    return {"rollout/reward_mean": reward, "rollout/success": reward, "actor/grad_norm": 1.0}


def _new_loop(tmp_path, *overrides) -> tuple[RunLoop, RunDir]:
    """A new run's loop, its folder made, on the small config with ``overrides``."""
    cfg = _config(*overrides)
    run = RunDir(tmp_path / "run")
    create_run_dir(run.root, cfg)
    return RunLoop(Trainer(cfg), run), run


def test_monitor_stop_ends_the_run_with_a_checkpoint_and_logs_alerts(tmp_path):
    loop, run = _new_loop(
        tmp_path, "trainer.steps=1", "monitor.action=stop", "monitor.warmup_steps=3"
    )
    step = 0
    while loop.state.stopped_at is None and step < 40:
        loop.watch(step, _collapse_metrics(step))
        step += 1
    alerts = read_jsonl(run.alerts).records
    assert loop.state.stopped_at == step - 1 and alerts[-1]["kind"] == "collapse"
    assert alerts[-1]["signal"] == "rollout/success" and alerts[-1]["step"] == step - 1
    loop.maybe_checkpoint(loop.state.stopped_at)
    state = json.loads((run.checkpoint(step) / checkpoint.STATE_FILE).read_text())
    assert loop.detector is not None and state["monitor"] == loop.detector.state_dict()


def test_monitor_rollback_restores_the_best_checkpoint_and_lowers_the_lr(tmp_path):
    loop, _ = _new_loop(
        tmp_path,
        "trainer.steps=5",
        "trainer.save_every=1",
        "trainer.eval_every=1",
        "monitor.action=rollback",
        "monitor.warmup_steps=3",
        "monitor.rollback_lr_scale=0.5",
        "monitor.rollback_filter_ratio=0.25",
    )
    cfg, m = loop.config, loop.trainer.m
    loop.state.eval_success = 0.9
    loop.maybe_checkpoint(0)  # step_1 has the best eval success: the rollback target
    best = {k: v.clone() for k, v in m.policy.state_dict().items()}
    with torch.no_grad():
        for param in m.policy.parameters():
            param.add_(1.0)
    loop.state.eval_success = 0.2
    loop.maybe_checkpoint(1)  # the newest, step_2, is worse
    step = 0
    while loop.state.rollbacks == 0 and step < 40:
        loop.watch(step, _collapse_metrics(step))
        step += 1
    assert loop.state.rollbacks == 1 and loop.state.stopped_at is None
    assert all(torch.equal(best[k], v) for k, v in m.policy.state_dict().items())
    lrs = [g["lr"] for g in m.optimizers["actor"].param_groups]
    assert lrs == [cfg.trainer.actor_lr * 0.5] * len(lrs)
    assert filter_ratio(cfg, loop.state.rollbacks) == 0.25 and cfg.algo.filter_ratio == 0.5


def _spell_loop(tmp_path, *overrides):
    """A loop rolling back on RAGEN-2's variance stop alone (2 low steps against the first
    2), whose step_1 is the rollback target with eval success 0.9."""
    loop, run = _new_loop(
        tmp_path,
        "trainer.steps=20",
        "trainer.save_every=1",
        "trainer.eval_every=1",
        "monitor.action=rollback",
        "monitor.act_on=early_stop",
        "monitor.variance_collapse_steps=2",
        "monitor.variance_baseline_steps=2",
        *overrides,
    )
    loop.state.eval_success = 0.9
    loop.maybe_checkpoint(0)
    return loop, run


def _spell(step):
    """Reward std 0.5 at steps 0-1 (the baseline), then 0: low from step 2 on."""
    return {REWARD_STD: 0.5 if step < 2 else 0.0}


def test_a_spell_a_rollback_did_not_lift_rolls_back_again_then_stops(tmp_path):
    loop, run = _spell_loop(tmp_path, "monitor.max_rollbacks=1")
    for step in range(4):
        loop.watch(step, _spell(step))
    # step 3, the second low step, rolls back to step_1; the checkpoint after it holds the
    # target's weights, which no evaluation measured there
    assert loop.state.rollbacks == 1 and loop.state.stopped_at is None
    loop.maybe_checkpoint(3)
    assert (
        json.loads((run.checkpoint(4) / checkpoint.STATE_FILE).read_text())["eval_success"] is None
    )
    # the spell goes on: step 5, two more low steps, calls it again, and the rollbacks are used
    for step in (4, 5):
        loop.watch(step, _spell(step))
    assert loop.state.stopped_at == 5 and loop.state.rollbacks == 1
    assert loop.state.stop_reason == "monitor.max_rollbacks=1 used"
    stops = [a["step"] for a in read_jsonl(run.alerts).records if a["signal"] == REWARD_STD]
    assert stops == [3, 5]


def test_a_run_the_monitor_stops_ends_with_an_evaluation_of_its_last_weights(tmp_path):
    loop, run = _new_loop(
        tmp_path,
        "trainer.steps=20",
        "trainer.eval_every=10",
        "trainer.eval_episodes=2",
        "monitor.action=stop",
        "monitor.act_on=early_stop",
        "monitor.variance_collapse_steps=2",
        "monitor.variance_baseline_steps=2",
    )
    for step in range(3):
        loop.watch(step, _spell(step))  # the baseline, then a first low step
    with loop._logger() as log:
        loop.run_step(3, log)  # the tiny model's groups all tie: std 0, the second low step
    assert loop.state.stopped_at == 3  # step 3 is no evaluation step (eval_every=10)
    envs = loop.config.env.eval_names
    evaluated = read_jsonl(run.evals).records
    assert [r["step"] for r in evaluated] == [3] * len(envs)
    (record,) = read_jsonl(run.metrics).records  # the step's line holds the figures
    assert [record[f"eval/{env}/success"] for env in envs] == [r["success"] for r in evaluated]
    state = json.loads((run.checkpoint(4) / checkpoint.STATE_FILE).read_text())
    assert state["stopped"] == [3, "monitor.action=stop"]
    assert state["eval_success"] == sum(r["success"] for r in evaluated) / len(envs)


def test_an_alert_on_the_last_step_is_logged_and_not_acted_on(tmp_path, capsys):
    loop, _ = _spell_loop(tmp_path)
    for step in range(3):
        loop.watch(step, _spell(step))
    loop.watch(3, _spell(3), last=True)
    assert loop.state.rollbacks == 0 and loop.state.stopped_at is None
    assert "[step 3] the run's last step: no rollback" in capsys.readouterr().out


def test_a_checkpoint_carries_only_its_own_weights_evaluation(tmp_path):
    _, run = _train(
        tmp_path, "run", "trainer.steps=2", "trainer.save_every=1", "trainer.eval_every=2",
        "trainer.eval_episodes=2",
    )  # fmt: skip
    kept = [
        json.loads((path / checkpoint.STATE_FILE).read_text())["eval_success"]
        for path in checkpoint.complete_checkpoints(run)
    ]
    # step 0's weights were not evaluated; step 1's were (eval_every=2)
    assert kept[0] is None and isinstance(kept[1], float) and len(kept) == 2


def test_the_run_state_keeps_its_stop_and_its_skipped_steps(capsys):
    state = RunState(rollbacks=1, eval_success=0.5, empty_steps=0, skipped_steps=2)
    state.stop(7, "trainer.max_minutes=30")
    again = RunState()
    again.restore(json.loads(json.dumps(state.saved())))
    # two non-finite steps in a row before the checkpoint: the third after it stops the run
    assert (again.rollbacks, again.eval_success, again.skipped_steps) == (1, 0.5, 2)
    assert "had stopped after step 7 (trainer.max_minutes=30); it trains on" in (
        capsys.readouterr().out
    )
    again.note_skipped(8, True, "trainer.actor_lr")
    assert again.stopped_at == 8 and again.diverged is not None
    RunState().restore({"rollbacks": 0})  # a checkpoint from before these were kept


def test_wall_clock_budget_ends_the_run_after_one_step_with_a_checkpoint(tmp_path):
    budget = ("trainer.steps=5", "trainer.max_minutes=1e-9")
    loop, run = _train(tmp_path, "run", *budget, "trainer.eval_every=3", "trainer.eval_episodes=2")
    assert [r["step"] for r in read_jsonl(run.metrics).records] == [0]
    assert [p.name for p in checkpoint.complete_checkpoints(run)] == ["step_000001"]
    evaluated = read_jsonl(run.evals).records  # the last step is evaluated, on every eval env
    assert {r["step"] for r in evaluated} == {0} and len(evaluated) == len(
        loop.config.env.eval_names
    )


def test_wall_clock_budget_counts_from_the_start_of_training(tmp_path):
    loop, run = _new_loop(
        tmp_path, "trainer.steps=2", "trainer.max_minutes=60", "trainer.eval_every=0"
    )
    loop.started -= 2 * 3600  # two hours spent with the trainer before train() (a base eval)
    loop.train()
    assert [r["step"] for r in read_jsonl(run.metrics).records] == [0, 1]
    assert loop.state.stopped_at is None


def test_a_resumed_run_counts_the_training_time_of_its_earlier_launches(tmp_path):
    loop, run = _new_loop(
        tmp_path, "trainer.steps=3", "trainer.max_minutes=60", "trainer.save_every=1"
    )
    loop.state.restore({"seconds": 2 * 3600.0})  # as a checkpoint two training hours in
    loop.train()
    assert [r["step"] for r in read_jsonl(run.metrics).records] == [0]
    assert loop.state.stop_reason == "trainer.max_minutes=60"
    kept = json.loads((run.checkpoint(1) / checkpoint.STATE_FILE).read_text())
    assert kept["seconds"] > 2 * 3600.0
