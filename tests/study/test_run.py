"""A study end to end with the tiny model: two short runs, the report, the table; a killed
study resumed redoes nothing it finished, continues its run from the checkpoint, and
refuses a changed plan; a killed study's run dies with it, and a run folder another process
still writes is left alone."""

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from functools import partial

import pytest

from ragen import config
from ragen.cli import main
from ragen.run import lock
from ragen.run.jsonl import append_jsonl, read_jsonl
from ragen.run.machine import this_cpu
from ragen.run.rundir import RunDir
from ragen.study import outputs, runner, spec
from ragen.train.loop import RunLoop

TINY = (
    "[model.spec=tiny, rollout.groups=4, rollout.group_size=2, trainer.mini_batch_size=4, "
    "trainer.micro_batch_size=2, rollout.max_reply_tokens=6, logging.progress=false, "
    "trainer.steps=2, trainer.eval_every=0, trainer.save_every=1, monitor.template_every=0]"
)

STUDY = f"""\
# two tiny runs
title: tiny
finding: the filter keeps half
paper: none
metric: rollout/success
columns: [filter/kept_groups]
scales:
  cpu: {{overrides: {TINY}}}
runs:
  - {{name: keep-all, preset: bandit, overrides: [algo.filter_ratio=1.0], paper: "1.0"}}
  - {{name: keep-half, preset: bandit, overrides: [algo.filter_ratio=0.5]}}
expect:
  - {{higher: keep-all, lower: keep-half}}
"""


@pytest.fixture
def study_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(STUDY)
    return path


def in_process(calls):
    """A launcher that runs `ragen train` in this process, recording what it ran."""

    def launch(run, resume):
        calls.append((run.name, resume))
        return main(runner.command_line(run, resume))

    return launch


def test_a_tiny_study_end_to_end(tmp_path, study_file, capsys, monkeypatch):
    # The runs in this process (each a process of its own imports torch and transformers
    # again); the process launcher is what the killed-study tests below run.
    calls = []
    monkeypatch.setattr(runner, "run_all", partial(runner.run_all, launch=in_process(calls)))
    out = tmp_path / "out"
    assert main(["study", str(study_file), "--out", str(out)]) == 0
    assert calls == [("keep-all", False), ("keep-half", False)]
    printed = capsys.readouterr().out
    for name in ("keep-all", "keep-half"):
        records = read_jsonl(out / name / "seed-0" / "metrics.jsonl").records
        assert [r["step"] for r in records] == [0, 1]
    state = json.loads((out / runner.STATE_FILE).read_text())
    assert {k: v["status"] for k, v in state["runs"].items()} == {
        "keep-all/seed-0": "done",
        "keep-half/seed-0": "done",
    }
    assert (out / "report" / "success.png").is_file() and (out / "report" / "summary.md").is_file()
    # The study reads only the runs' logs: a finished run's checkpoints are given back.
    assert not (out / "keep-all" / "seed-0" / "checkpoints").exists()
    assert printed.count("removed its checkpoints") == 2
    result = json.loads((out / outputs.RESULTS_FILE).read_text())
    kept = {}
    for row in result["runs"]:
        (seed,) = row["seeds"]
        records = read_jsonl(out / row["name"] / "seed-0" / "metrics.jsonl").records
        assert seed["end"]["value"] == records[-1]["rollout/success"]  # tail 1: the last step
        assert seed["start"]["value"] == records[0]["rollout/success"]
        kept[row["name"]] = row["columns"]["filter/kept_groups"]["mean"]
    assert kept == {"keep-all": 4.0, "keep-half": 2.0}  # of 4 groups
    (verdict,) = result["expect"]
    assert verdict["outcome"].startswith("untested")  # one seed of a train metric: no error
    table = (out / outputs.TABLE_FILE).read_text()
    assert table in printed and "| keep-all | `bandit` | 1 |" in table


def test_a_killed_study_resumes_without_redoing_what_it_finished(tmp_path, study_file, monkeypatch):
    out = tmp_path / "out"
    study = spec.load_study(str(study_file))
    planned = spec.plan(study, "cpu", 1, out)
    save = RunLoop.maybe_checkpoint

    def killed_after_first_checkpoint(self, step, last=False):
        save(self, step, last)
        if self.config.algo.filter_ratio == 0.5:
            raise KeyboardInterrupt  # Ctrl-C in the second run, its step 1 saved

    monkeypatch.setattr(RunLoop, "maybe_checkpoint", killed_after_first_checkpoint)
    calls = []
    with pytest.raises(runner.StudyError, match="keep-half seed 0 ended with exit status 130"):
        runner.run_all(planned, out, study="tiny", scale="cpu", launch=in_process(calls))
    assert calls == [("keep-all", False), ("keep-half", False)]
    finished = (out / "keep-all" / "seed-0" / "metrics.jsonl").read_bytes()
    assert (out / "keep-half" / "seed-0" / "checkpoints").is_dir()  # unfinished: kept

    monkeypatch.setattr(RunLoop, "maybe_checkpoint", save)
    calls.clear()
    runner.run_all(planned, out, study="tiny", scale="cpu", launch=in_process(calls))
    assert calls == [("keep-half", True)]  # resumed from its checkpoint, keep-all kept
    assert (out / "keep-all" / "seed-0" / "metrics.jsonl").read_bytes() == finished
    resumed = read_jsonl(out / "keep-half" / "seed-0" / "metrics.jsonl").records
    assert [r["step"] for r in resumed] == [0, 1]

    calls.clear()
    runner.run_all(planned, out, study="tiny", scale="cpu", launch=in_process(calls))
    assert calls == []  # all done: nothing runs again


def test_a_running_runs_minutes_reach_study_json_while_it_runs(tmp_path, study_file, monkeypatch):
    # A study killed outright (the machine stopped) writes nothing at its end: what it ran
    # counts only if study.json has it already.
    monkeypatch.setattr(runner, "TICK_S", 0.01)
    out = tmp_path / "out"
    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out)[:1]
    seen = []

    def run_then_watch(run, resume):
        status = in_process([])(run, resume)  # the real run, then its ticks read back
        for _ in range(500):
            entry = json.loads((out / "study.json").read_text())["runs"]["keep-all/seed-0"]
            if entry["minutes"] > 0:
                seen.append(entry)
                break
            time.sleep(0.01)
        return status

    runner.run_all(planned, out, study="tiny", scale="cpu", launch=run_then_watch)
    (ticked,) = seen
    assert ticked["status"] == "running" and ticked["minutes"] > 0
    done = json.loads((out / "study.json").read_text())["runs"]["keep-all/seed-0"]
    assert done["status"] == "done" and done["minutes"] >= ticked["minutes"]


def test_a_tick_that_fails_ends_the_ticking_and_not_the_body():
    ticks = []

    def tick():
        ticks.append(len(ticks))
        raise OSError("No space left on device")

    with runner.ticking(tick, 0.001):
        time.sleep(0.05)
    assert ticks == [0]  # one failed tick, then none


def test_keep_checkpoints_keeps_a_finished_runs_checkpoints(tmp_path, study_file):
    out = tmp_path / "out"
    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out)
    runner.run_all(
        planned[:1], out, study="tiny", scale="cpu", launch=in_process([]), keep_checkpoints=True
    )
    saved = sorted(p.name for p in (out / "keep-all" / "seed-0" / "checkpoints").iterdir())
    assert saved == ["step_000001", "step_000002"]


def test_a_finished_runs_own_warm_start_loses_its_checkpoints_too(tmp_path):
    run = RunDir(tmp_path / "run")  # a run with sft.warm_start: RL's checkpoints, and its stage's
    for folder in (run.checkpoint(2), run.warm_start.checkpoint(4)):
        folder.mkdir(parents=True)
        with open(folder / "model.safetensors", "wb") as weights:
            weights.truncate(2**29)  # half a GiB by its size, sparse on disk
    (run.warm_start.metrics).write_text('{"step": 0}\n')
    said = []
    runner._drop_checkpoints(run, said.append)
    assert not run.checkpoints.exists() and not run.warm_start.checkpoints.exists()
    assert said == ["removed its checkpoints (1.0 GiB; --keep-checkpoints keeps them)"]
    assert run.warm_start.metrics.is_file()  # the logs the study reads stay


def test_a_run_folder_without_a_checkpoint_is_set_aside(tmp_path, study_file):
    out = tmp_path / "out"
    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out)
    stale = out / "keep-all" / "seed-0"
    stale.mkdir(parents=True)
    (stale / "metrics.jsonl").write_text('{"step": 0}\n')  # killed before its first save
    runner.StudyState(out, "tiny", "cpu").mark(planned[0], "running", minutes=500.0)
    calls = []
    runner.run_all(planned[:1], out, study="tiny", scale="cpu", launch=in_process(calls))
    assert calls == [("keep-all", False)]
    aside = out / "keep-all" / "seed-0.incomplete-1"
    assert (aside / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert len(read_jsonl(stale / "metrics.jsonl").records) == 2
    # the attempt set aside spent its minutes on nothing this run resumes from
    assert runner.StudyState(out, "tiny", "cpu").minutes(planned[0]) < 500.0


def test_a_changed_plan_or_another_study_is_refused_before_anything_runs(tmp_path, study_file):
    out = tmp_path / "out"
    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out)
    calls = []
    runner.run_all(planned[:1], out, study="tiny", scale="cpu", launch=in_process(calls))
    changed = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out, ("algo.kl_coef=0.01",))
    with pytest.raises(runner.StudyError, match="but the study now asks for"):
        runner.run_all(changed, out, study="tiny", scale="cpu", launch=in_process(calls))
    # how often a run checkpoints, and what it logs to, change what it writes, not its results
    bookkeeping = (
        "trainer.save_every=0",
        "trainer.keep_checkpoints=3",
        "logging.tensorboard=false",
    )
    rewritten = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out, bookkeeping)
    runner.run_all(rewritten[:1], out, study="tiny", scale="cpu", launch=in_process(calls))
    with pytest.raises(runner.StudyError, match="holds the study 'tiny' at scale 'cpu'"):
        runner.run_all(planned, out, study="other", scale="cpu", launch=in_process(calls))
    assert calls == [("keep-all", False)]


def test_a_preset_that_changed_under_a_recorded_run_is_refused(tmp_path, study_file):
    # The same preset and overrides, but the preset file now gives other values: the runs
    # left would train otherwise than the recorded ones, so the study refuses to mix them.
    preset = tmp_path / "mine.yaml"
    preset.write_text("extends: bandit\nalgo: {kl_coef: 0.0, clip_high: 0.2}\n")
    study_file.write_text(STUDY.replace("preset: bandit", f"preset: {preset}"))
    out = tmp_path / "out"
    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out)
    calls = []
    runner.run_all(planned[:1], out, study="tiny", scale="cpu", launch=in_process(calls))
    recorded = json.loads((out / runner.STATE_FILE).read_text())["runs"]["keep-all/seed-0"]
    assert recorded["settings"]["algo.kl_coef"] == 0.0
    assert (
        recorded["settings"]["algo.filter_ratio"] == 1.0 and "trainer.seed" in recorded["settings"]
    )
    runner.run_all(planned, out, study="tiny", scale="cpu", launch=in_process(calls))  # unchanged
    assert calls == [("keep-all", False), ("keep-half", False)]
    preset.write_text("extends: bandit\nalgo: {kl_coef: 0.01, clip_high: 0.3}\n")
    replanned = spec.plan(spec.load_study(str(study_file)), "cpu", 2, out)
    with pytest.raises(runner.StudyError) as refused:
        runner.run_all(replanned, out, study="tiny", scale="cpu", launch=in_process(calls))
    assert str(refused.value) == (
        f"{out / 'keep-all' / 'seed-0'} was run with settings that {str(preset)!r} and its "
        "overrides no longer give: algo.clip_high 0.2 → 0.3, algo.kl_coef 0.0 → 0.01 (the "
        "preset or ragen's defaults changed since): undo that change, or run the study in a "
        "new --out"
    )
    assert len(calls) == 2  # refused before anything ran: seed 1 would have mixed them
    # a record from a ragen that kept no settings is judged by its preset and overrides only
    state = json.loads((out / runner.STATE_FILE).read_text())
    for entry in state["runs"].values():
        del entry["settings"]
    (out / runner.STATE_FILE).write_text(json.dumps(state))
    runner.run_all(replanned, out, study="tiny", scale="cpu", launch=in_process(calls))
    assert calls[2:] == [("keep-all", False), ("keep-half", False)]  # seed 1's


@pytest.mark.parametrize("text", ['{"study": "tiny", "scale": "cpu", "runs": [1]}', "{not json"])
def test_a_damaged_study_record_is_refused_not_overwritten(tmp_path, study_file, text):
    out = tmp_path / "out"
    out.mkdir()
    (out / runner.STATE_FILE).write_text(text)
    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out)
    calls = []
    with pytest.raises(runner.StudyError, match=r"study\.json is unreadable"):
        runner.run_all(planned, out, study="tiny", scale="cpu", launch=in_process(calls))
    assert calls == [] and (out / runner.STATE_FILE).read_text() == text


WARM_STUDY = f"""\
# one tiny run from a warm start
title: warm
finding: imitation first
paper: none
scales:
  cpu:
    warm_start:
      preset: bandit
      overrides: [model.spec=tiny, sft.steps=1, sft.dialogues=4, sft.micro_batch_size=2,
                  logging.progress=false, trainer.eval_every=0, trainer.eval_episodes=2]
    overrides: {TINY.replace("model.spec=tiny, ", "").replace("trainer.steps=2", "trainer.steps=1")}
runs:
  - {{name: rl, preset: bandit}}
"""

TWO_RUNS = WARM_STUDY.replace(
    "  - {name: rl, preset: bandit}", "  - {name: a, preset: bandit}\n  - {name: b, preset: bandit}"
)
"""The warm-started study with two runs, a and b, from its warm start."""


def test_the_runs_of_a_warm_started_study_start_from_its_last_checkpoint(tmp_path):
    path = tmp_path / "warm.yaml"
    path.write_text(WARM_STUDY)
    study, out = spec.load_study(str(path)), tmp_path / "out"
    planned = spec.plan(study, "cpu", 1, out)
    calls = []
    state = runner.run_all(planned, out, study="warm", scale="cpu", launch=in_process(calls))
    assert calls == [("warm-start", False), ("rl", False)]
    assert {k: v["status"] for k, v in state.data["runs"].items()} == {
        "warm-start/seed-0": "done",
        "rl/seed-0": "done",
    }
    checkpoint = out / "warm-start" / "seed-0" / "checkpoints" / "step_000001"
    assert (checkpoint / "config.json").is_file()  # kept: the runs start from it
    assert not (out / "rl" / "seed-0" / "checkpoints").exists()
    assert config.load(str(out / "rl" / "seed-0" / "config.yaml")).model.spec == str(checkpoint)
    outputs.write_outputs(study, "cpu", planned, state, out)
    result = json.loads((out / outputs.RESULTS_FILE).read_text())
    assert [row["name"] for row in result["runs"]] == ["rl"]  # the fine-tuning is no row

    # a warm start that lost its checkpoint is not started from
    (out / "rl" / "seed-0").rename(out / "rl-aside")
    del state.data["runs"]["rl/seed-0"]
    (out / runner.STATE_FILE).write_text(json.dumps(state.data))
    shutil.rmtree(checkpoint)
    with pytest.raises(runner.StudyError, match=r"rl seed 0 starts from .*step_000001, which is"):
        runner.run_all(planned, out, study="warm", scale="cpu", launch=in_process(calls))
    assert len(calls) == 2


def test_a_run_killed_by_a_signal_is_said_so(tmp_path, study_file, capsys):
    out = tmp_path / "out"
    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out)

    def killed(run, resume):  # a real process, ended by SIGKILL as the kernel's OOM killer does
        kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
        return subprocess.call([sys.executable, "-c", kill])

    with pytest.raises(runner.StudyError) as refused:
        runner.run_all(planned, out, study="tiny", scale="cpu", launch=killed)
    assert str(refused.value).startswith(
        "keep-all seed 0 killed by SIGKILL (its output is above): on Linux most often the "
        "kernel's out-of-memory killer"
    )
    capsys.readouterr()  # what the study printed
    shown = _status(study_file, out, capsys).splitlines()
    assert shown[1].startswith("  failed   keep-all seed 0")
    assert shown[1].endswith(
        "0 of 2 steps logged, killed by SIGKILL; no checkpoint: it starts again"
    )
    assert runner.exit_reason(-1000) == "killed by signal 1000"  # no such signal: its number


def test_the_time_left_is_the_pace_of_the_done_runs_of_each_name(tmp_path):
    path = tmp_path / "warm.yaml"
    path.write_text(TWO_RUNS)
    planned = spec.plan(spec.load_study(str(path)), "cpu", 3, tmp_path / "out")
    state = runner.StudyState(tmp_path, "warm", "cpu")
    assert runner.time_left(planned, state) is None  # nothing done: no pace yet
    warm0, a0, b0, _, a1, b1, *_ = planned  # per seed: its warm start, then a and b
    state.mark(warm0, "done", minutes=4.0)
    assert runner.time_left(planned, state) is None  # no run of `ragen train` done yet
    state.mark(a0, "done", minutes=30.0)
    here, elsewhere = this_cpu(), {"cpu": "another CPU", "cpu_capability": "AVX512"}
    # b has none done: paced by its command's runs (a0); no run says where it ran
    left = runner.time_left(planned, state, here)
    assert left == runner.TimeLeft(2 * 4.0 + 5 * 30.0, here=False)
    assert left.line() == (
        "about 2.6 h left at the pace of the runs done (some elsewhere: this machine may differ)"
    )
    state.mark(b0, "done", minutes=20.0)
    for run in (warm0, a0, b0):
        RunDir(run.root).machine.parent.mkdir(parents=True)
        append_jsonl(RunDir(run.root).machine, [{"step": 0, "device": "cpu", **here}])
    left = runner.time_left(planned, state, here)  # each name paced by its own: a 30, b 20
    assert left == runner.TimeLeft(2 * 4.0 + 2 * 30.0 + 2 * 20.0, here=True)
    assert left.line() == "about 1.8 h left at the pace of the runs done on this machine"
    # a1 done on another machine: the runs of a done here pace a2 alone
    state.mark(a1, "done", minutes=50.0)
    RunDir(a1.root).machine.parent.mkdir(parents=True)
    append_jsonl(RunDir(a1.root).machine, [{"step": 0, "device": "cpu", **elsewhere}])
    assert runner.time_left(planned, state, here) == runner.TimeLeft(
        2 * 4.0 + 30.0 + 2 * 20.0, True
    )
    # a0 went on on another machine: no run of a ran here alone, so both pace a2
    append_jsonl(RunDir(a0.root).machine, [{"step": 3, "device": "cpu", **elsewhere}])
    assert runner.time_left(planned, state, here) == runner.TimeLeft(8.0 + 40.0 + 40.0, False)
    # a run under way has spent some of its share, up to the mean
    state.mark(b1, "running", minutes=10.0)
    assert runner.time_left(planned, state, here) == runner.TimeLeft(8.0 + 40.0 + 30.0, False)
    state.mark(b1, "running", minutes=99.0)
    assert runner.time_left(planned, state, here) == runner.TimeLeft(8.0 + 40.0 + 20.0, False)


def test_a_study_launches_its_runs_without_importing_the_working_directory(tmp_path, monkeypatch):
    # A yaml.py beside the user would be imported in PyYAML's place by `python -m ragen`.
    marker = tmp_path / "imported"
    (tmp_path / "yaml.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "command_line", lambda run, resume: ["config", "show", "bandit"])
    assert runner.launch_process(None, resume=False) == 0  # a preset, read with PyYAML
    assert not marker.exists()


LONG_STUDY = STUDY.replace("trainer.steps=2", "trainer.steps=1000")  # killed in its first run


def _wait_for(ready, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"{what} within {seconds:.0f} s"
        time.sleep(0.2)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_killed_studys_run_dies_with_it(tmp_path, sig):
    path, out = tmp_path / "long.yaml", tmp_path / "out dir"
    path.write_text(LONG_STUDY)
    run = RunDir(out / "keep-all" / "seed-0")
    err = tmp_path / "study.err"
    with err.open("w") as stderr:
        study = subprocess.Popen(
            [sys.executable, "-P", "-m", "ragen", "study", str(path), "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # its own group: the cleanup below reaches a leftover run
        )
    try:
        _wait_for(lambda: study.poll() is not None or lock.holder(run), 240, "a run started")
        assert study.poll() is None, err.read_text()[-2000:]
        child = json.loads(run.lock.read_text())["pid"]
        assert child != study.pid  # the run is its own process
        study.send_signal(sig)
        assert study.wait(timeout=120) == (130 if sig == signal.SIGTERM else -signal.SIGKILL)
        if sig == signal.SIGTERM:  # the study waited for its run and says how to go on
            assert lock.holder(run) is None
            said = err.read_text()
            assert "interrupted; continue with: ragen study" in said
            assert f"--out {shlex.quote(str(out))}" in said  # a folder with a space
        _wait_for(lambda: lock.holder(run) is None, 60, f"the run (pid {child}) ended")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a run left over, if any
            os.killpg(study.pid, signal.SIGKILL)
        study.wait()


HOLDER = """
import sys, time
from pathlib import Path
from ragen.run.rundir import RunDir
from ragen.run.lock import hold
with hold(RunDir(Path(sys.argv[1]))):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_rerun_never_moves_a_folder_a_live_run_writes(tmp_path, study_file):
    out = tmp_path / "out"
    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out)
    busy = out / "keep-all" / "seed-0"
    busy.mkdir(parents=True)
    (busy / "metrics.jsonl").write_text('{"step": 0}\n')  # no checkpoint yet: set aside once free
    writer = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(busy)], stdout=subprocess.PIPE, text=True
    )
    calls: list = []
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "held"
        holder = f"pid {writer.pid} on host {socket.gethostname()}"
        with pytest.raises(runner.StudyError, match=f"{busy} is being written by {holder}"):
            runner.run_all(planned[:1], out, study="tiny", scale="cpu", launch=in_process(calls))
        assert calls == [] and sorted(p.name for p in busy.parent.iterdir()) == ["seed-0"]
        assert (busy / "metrics.jsonl").read_text() == '{"step": 0}\n'
    finally:
        writer.kill()
        writer.wait()
    runner.run_all(planned[:1], out, study="tiny", scale="cpu", launch=in_process(calls))
    assert calls == [("keep-all", False)]  # its writer gone, the folder is set aside as before
    assert (out / "keep-all" / "seed-0.incomplete-1" / "metrics.jsonl").is_file()


def _status(study_file, out, capsys) -> str:
    assert main(["study", str(study_file), "--out", str(out), "--status"]) == 0
    return capsys.readouterr().out


def test_status_reads_each_runs_state_and_the_table_so_far(
    tmp_path, study_file, monkeypatch, capsys
):
    out = tmp_path / "out"
    assert _status(study_file, out, capsys) == (
        f"nothing has run in {out} yet: 2 runs planned (`--plan` prints their commands)\n"
    )
    assert not out.exists()  # it reads only
    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 1, out)
    save = RunLoop.maybe_checkpoint

    def killed_after_first_checkpoint(self, step, last=False):
        save(self, step, last)
        if self.config.algo.filter_ratio == 0.5:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunLoop, "maybe_checkpoint", killed_after_first_checkpoint)
    with pytest.raises(runner.StudyError):
        runner.run_all(planned, out, study="tiny", scale="cpu", launch=in_process([]))
    capsys.readouterr()
    state = json.loads((out / runner.STATE_FILE).read_text())
    first = state["runs"]["keep-all/seed-0"]["minutes"]
    shown = _status(study_file, out, capsys)
    lines = shown.splitlines()
    assert lines[0] == f"tiny, 1 seed(s), in {out}: 1 of 2 runs done"
    assert lines[1] == f"  done     keep-all seed 0   {first:6.1f} min"
    assert lines[2].startswith("  failed   keep-half seed 0")
    assert lines[2].endswith(
        "1 of 2 steps logged, exit status 130; resumes from its checkpoint at step 1"
    )
    assert lines[3].startswith("ran on: ")  # both runs' machine.jsonl: this machine
    assert lines[4] == "no study process is running: the same `ragen study` command goes on"
    # The table so far has the finished run's row only; the expectation needs both.
    assert "| keep-all | `bandit` | 1 |" in shown and "| keep-half |" not in shown
    assert "- Expected keep-all above keep-half: not measured." in shown

    # A study killed outright leaves its run "running" with no process behind it.
    state["runs"]["keep-half/seed-0"]["status"] = "running"
    (out / runner.STATE_FILE).write_text(json.dumps(state))
    assert "  stopped  keep-half seed 0" in _status(study_file, out, capsys)
    with lock.hold(RunDir(out / "keep-half" / "seed-0")), lock.hold(RunDir(out)):
        shown = _status(study_file, out, capsys).splitlines()
    mine = f"pid {os.getpid()} on host {socket.gethostname()}"
    assert "1 of 2 steps logged; written by " + mine in shown[2]
    assert shown[4].startswith(f"the study is running: {mine}")
    assert json.loads((out / runner.STATE_FILE).read_text()) == state  # nothing written

    monkeypatch.setattr(RunLoop, "maybe_checkpoint", save)
    runner.run_all(planned, out, study="tiny", scale="cpu", launch=in_process([]))
    state = runner.StudyState(out, "tiny", "cpu")
    finished = outputs.write_outputs(spec.load_study(str(study_file)), "cpu", planned, state, out)
    capsys.readouterr()
    shown = _status(study_file, out, capsys)
    assert "all runs done: the same `ragen study` command writes the report and table" in shown
    said = "each expectation judged on the seeds both its runs have done"
    assert shown.endswith(f"The runs done so far ({said}):\n\n" + finished.table)


def test_status_of_a_folder_holding_another_study_is_refused(tmp_path, study_file, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / runner.STATE_FILE).write_text('{"study": "other", "scale": "cpu", "runs": {}}')
    assert main(["study", str(study_file), "--out", str(out), "--status"]) == 1
    assert "holds the study 'other'" in capsys.readouterr().err


def test_status_names_the_machines_the_runs_ran_on(tmp_path, study_file):
    from ragen.run.jsonl import append_jsonl
    from ragen.study.status import machine_lines

    planned = spec.plan(spec.load_study(str(study_file)), "cpu", 2, tmp_path)
    zen5 = {"cpu": "AMD EPYC 9B45", "cpu_capability": "AVX512", "model_dtype": "bfloat16"}
    zen3 = {"cpu": "AMD EPYC 7B13", "cpu_capability": "AVX2", "model_dtype": "float32"}
    assert machine_lines(planned) == []  # nothing started
    for run in planned[:3]:
        run.root.mkdir(parents=True)
    append_jsonl(RunDir(planned[0].root).machine, [{"step": 0, **zen5}])
    append_jsonl(RunDir(planned[1].root).machine, [{"step": 0, **zen5}])
    assert machine_lines(planned) == [
        "ran on: AMD EPYC 9B45, AVX512, bfloat16",
        "  no machine.jsonl (run before ragen recorded it): keep-all seed 1",
    ]
    append_jsonl(RunDir(planned[1].root).machine, [{"step": 1, **zen3}])  # resumed elsewhere
    append_jsonl(RunDir(planned[2].root).machine, [{"step": 0, **zen3}, "torn"])
    assert machine_lines(planned) == [
        "ran on 2 machines, whose numbers differ for the same settings:",
        "  AMD EPYC 9B45, AVX512, bfloat16: keep-all seed 0, keep-half seed 0",
        "  AMD EPYC 7B13, AVX2, float32: keep-half seed 0, keep-all seed 1",
    ]
