"""The metrics logger: every step on disk when log returns, TensorBoard scalars, episode files,
and a killed run that keeps every completed step."""

import signal
import subprocess
import sys
import textwrap

from ragen.run.jsonl import read_jsonl
from ragen.run.metrics_logger import MetricsLogger
from ragen.run.rundir import RunDir


def test_metrics_are_on_disk_after_each_step(tmp_path):
    run = RunDir(tmp_path)
    with MetricsLogger(run, tensorboard=False) as log:
        log.log(0, {"rollout/success": 0.25, "actor/grad_norm": float("nan")})
        first = read_jsonl(run.metrics).records  # read before close: already flushed
        log.log(1, {"rollout/success": 0.5})
    assert [r["step"] for r in first] == [0]
    assert first[0]["rollout/success"] == 0.25
    assert first[0]["actor/grad_norm"] is None  # NaN is written as JSON null
    records = read_jsonl(run.metrics).records
    assert [(r["step"], r["rollout/success"]) for r in records] == [(0, 0.25), (1, 0.5)]


def test_tensorboard_events_hold_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = RunDir(tmp_path)
    with MetricsLogger(run) as log:
        for step in range(3):
            log.log(step, {"rollout/reward_mean": step / 2, "note": "text is skipped"})
    events = EventAccumulator(str(run.tensorboard))
    events.Reload()
    scalars = events.Scalars("rollout/reward_mean")
    assert [(s.step, s.value) for s in scalars] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert "note" not in events.Tags()["scalars"]


def test_episodes_go_to_their_step_file(tmp_path):
    run = RunDir(tmp_path)
    episodes = [{"env": "bandit", "group": g, "seed": 7, "success": g == 1} for g in range(2)]
    with MetricsLogger(run, tensorboard=False) as log:
        assert log.log_episodes(3, episodes) == 2
    assert read_jsonl(run.trajectory_file(3)).records == episodes


def test_a_killed_run_keeps_every_completed_step(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from ragen.run.metrics_logger import MetricsLogger
        from ragen.run.rundir import RunDir
        run = RunDir(Path({str(tmp_path)!r}))
        log = MetricsLogger(run, tensorboard=False)
        for step in range(3):
            log.log(step, {{"rollout/success": step / 4}})
        with open(run.metrics, "a") as fh:  # step 3 is being written when the kill lands
            fh.write('{{"step": 3, "rollout/succ')
            fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    read = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["rollout/success"] for r in read.records] == [0.0, 0.25, 0.5]
    assert read.skipped == [4]
