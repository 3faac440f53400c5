import json
import math
import signal
import subprocess
import sys
import textwrap

import pytest

from ragen import config
from ragen.monitor.jsonl import JsonlRead, RunDirError, append_jsonl, read_jsonl
from ragen.monitor.metrics_logger import MetricsLogger
from ragen.monitor.rundir import RunDir, create_run_dir, default_run_root


def test_run_dir_layout_and_reloadable_config(tmp_path):
    c = config.load("sokoban", ["algo.clip_high=0.3"])
    run = create_run_dir(tmp_path / "run", c)
    assert run.config.is_file() and run.trajectories.is_dir() and run.checkpoints.is_dir()
    assert config.load(str(run.config)) == c
    assert run.trajectory_file(3).name == "step_000003.jsonl"
    assert run.checkpoint(50).name == "step_000050"


def test_existing_run_dir_is_never_overwritten(tmp_path):
    c = config.load("bandit")
    create_run_dir(tmp_path / "run", c)
    with pytest.raises(RunDirError, match="--resume"):
        create_run_dir(tmp_path / "run", c)
    (tmp_path / "empty").mkdir()
    create_run_dir(tmp_path / "empty", c)  # an empty folder is fine


def test_default_run_root_names_the_preset():
    from datetime import UTC, datetime

    when = datetime(2026, 11, 21, 6, 5, 4, tzinfo=UTC)
    assert str(default_run_root("bandit", when)) == "runs/bandit-20261121-060504"
    assert str(default_run_root("configs/my.yaml", when)) == "runs/my-20261121-060504"
    # a user env's import name: no colon or dots in the folder name
    assert str(default_run_root("eval-mypkg.mazes:Maze", when)) == (
        "runs/eval-mypkg-mazes-Maze-20261121-060504"
    )


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


def test_torn_and_junk_lines_are_skipped_and_counted(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n[1, 2]\n\n{"step": 1}\n{"step": 2, "rollo')
    read = read_jsonl(path)
    assert [r["step"] for r in read.records] == [0, 1]
    assert read.skipped == [2, 3, 6]
    append_jsonl(path, [{"step": 3}])  # the torn line must not swallow the new record
    assert [r["step"] for r in read_jsonl(path).records] == [0, 1, 3]


def test_a_failed_append_leaves_the_file_as_it_was(tmp_path):
    # Under a file size limit the record does not fit, as on a full disk: the old file (a
    # torn last line included, which the append would first end) keeps every byte, and a
    # file the append created is gone.
    old = tmp_path / "metrics.jsonl"
    old.write_text('{"step": 0}\n{"step": 1, "rollo')
    script = textwrap.dedent(
        f"""
        import resource, signal
        from pathlib import Path
        from ragen.monitor.jsonl import append_jsonl
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
        for name in ("metrics.jsonl", "new.jsonl"):
            try:
                append_jsonl(Path({str(tmp_path)!r}) / name, [{{"step": 1, "pad": "x" * 80}}])
            except OSError as err:
                print(err.strerror)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.stdout.splitlines() == ["File too large", "File too large"]
    assert old.read_text() == '{"step": 0}\n{"step": 1, "rollo'
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_a_killed_run_keeps_every_completed_step(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from ragen.monitor.metrics_logger import MetricsLogger
        from ragen.monitor.rundir import RunDir
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


def test_lines_are_strict_json(tmp_path):
    path = tmp_path / "x.jsonl"
    append_jsonl(path, [{"a": math.inf, "b": [1.0, -math.inf], "c": "√ ×"}])
    line = path.read_text(encoding="utf-8").strip()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(c)) == {
        "a": None,
        "b": [1.0, None],
        "c": "√ ×",
    }


def test_lines_json_accepts_but_no_reader_can_use_are_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        '{"step": 0, "reply": "\\ud83d\\ude00", "big": 1E+300, "tiny": 1e-999}',  # all fine
        '{"step": 1, "reply": "\\ud800"}',  # a lone surrogate: no UTF-8 form
        '{"step": 2, "reply": "ok", "k\\uDFFF": 1}',  # in a key, upper-case escape
        '{"step": 3, "x": 1e999}',  # inf
        '{"step": 4, "x": -1' + "0" * 250 + "e99}",  # -inf from a long mantissa
        '{"step": 5, "x": ' + "9" * 400 + "}",  # an int float() cannot hold
        '{"step": 6, "x": ' + "9" * 5000 + "}",  # past Python's int-string limit
        '{"step": 7, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",  # past the recursion limit
        '{"step": 8, "x": ' + "9" * 300 + "}",  # big but a float holds it
        '{"step": 9, "note": "caf\\u00e9 \\\\ud800 is written as text"}',
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    read = read_jsonl(path)
    assert [r["step"] for r in read.records] == [0, 8, 9]
    assert read.records[0] == {"step": 0, "reply": "😀", "big": 1e300, "tiny": 0.0}
    assert read.records[2]["note"] == "café \\ud800 is written as text"
    assert read.skipped == [2, 3, 4, 5, 6, 7, 8]


def test_a_log_that_is_not_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(RunDirError, match=r"metrics.jsonl \(Is a directory\): it must be"):
        read_jsonl(tmp_path / "metrics.jsonl")
    assert read_jsonl(tmp_path / "missing.jsonl") == JsonlRead([], [])
