"""Running a study: its ``ragen train`` runs one after the other, resumable at any point.

``OUT/study.json`` records each run as it starts and ends. A study run again with the same
``--out`` skips the runs it finished, continues the one it was in from that run's last
checkpoint (`ragen train --resume`), and starts the rest; a run folder left with no
checkpoint is moved aside (``seed-K.incomplete-N``), never deleted, and a folder that a
live process still writes (its ``.lock`` held) is neither moved nor resumed. The settings
of every recorded run must be the ones the study asks for now, or the study refuses: its
figures would otherwise mix two configurations. That holds for the values as well as the
words: each run records every setting its preset and overrides resolved to when it started,
so a preset file or a default of ragen changed under a study stops it before the next seed.

A finished run's checkpoints are removed unless asked to keep them: the study reads only
its logs, and at CPU scale one run's checkpoints (model, critic and their optimiser states)
take 1.5-6 GB, enough for a few studies to fill a disk. A warm start's are kept: the
runs of its seed start from its last one.

Each run is its own process (`python -m ragen train`), so a run that dies (out of memory,
a bad level) takes nothing else with it, and the study stops at it, saying how to go on. The
study's death, however, takes its run with it (`launch_process`).
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from ragen.run.jsonl import write_atomic
from ragen.run.lock import hold, holder
from ragen.run.machine import ran_only_on, this_cpu
from ragen.run.rundir import RunDir
from ragen.study.spec import SFT, TRAIN, PlannedRun, changed_settings, compared
from ragen.train.checkpoint import complete_checkpoints

STATE_FILE = "study.json"
AGAIN = "run the same `ragen study` command again"
"""What a study stopped by a failed write (a full disk) says to do once it is fixed."""
Launch = Callable[[PlannedRun, bool], int]
"""Runs one planned run (True: resume it from its checkpoint); returns its exit status."""


class StudyError(RuntimeError):
    """A study that cannot go on; the message says why and what to do."""


def command_line(run: PlannedRun, resume: bool) -> list[str]:
    """The `ragen` argument list of ``run`` (`train`, or `sft` for a warm start): a new
    run, or the resume of its folder."""
    if resume:
        return [run.command, "--resume", str(run.root)]
    head = [TRAIN, run.preset] if run.command == TRAIN else [SFT, run.env, "--preset", run.preset]
    return [*head, *run.launch_overrides(), "--out", str(run.root)]


def launch_process(run: PlannedRun, resume: bool) -> int:
    """Run ``run`` as its own process of this Python; its output goes to the terminal.
    ``-P``: the working directory is not put on the import path, so a ``yaml.py`` (or any
    module) lying there is never imported in ragen's place; PYTHONPATH and installed
    packages still reach user envs.

    The run ends with the study: on Linux the kernel sends it SIGTERM when the study's
    process dies, however it dies (SIGKILL included), and a study stopped by an exception
    (Ctrl-C, or SIGTERM, which `stopping_on_sigterm` makes one) terminates it and waits for
    it. A run left writing its folder would otherwise fight the study run again."""
    command = [sys.executable, "-P", "-m", "ragen", *command_line(run, resume)]
    with subprocess.Popen(command, preexec_fn=_parent_death_signal()) as child:
        try:
            return child.wait()
        except BaseException:
            child.terminate()
            try:
                child.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                child.kill()
            raise


STOP_WAIT_S = 60.0
"""Seconds a run stopped with the study has to end before it is killed (a checkpoint being
written finishes in that time at CPU scale; one cut short is never read, see checkpoint.py)."""
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _parent_death_signal() -> Callable[[], None] | None:
    """What the run's process calls before it starts `ragen`: ask Linux for SIGTERM when its
    parent (this thread of the study) dies, which outlives the exec. A study that died before
    the ask finds the run already orphaned, so it ends at once. None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before the fork, not in the child
    study = os.getpid()

    def ask() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != study:
            os._exit(128 + signal.SIGTERM)

    return ask


@contextmanager
def stopping_on_sigterm() -> Iterator[None]:
    """While the block runs, SIGTERM stops the study as Ctrl-C does (KeyboardInterrupt): the
    run in progress is terminated and waited for, and the study says how to go on."""
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def run_key(run: PlannedRun) -> str:
    """``RUN/seed-K``: how study.json names ``run``."""
    return f"{run.name}/seed-{run.seed}"


class StudyState:
    """``OUT/study.json``: the study, its scale, and each run's settings and status."""

    def __init__(self, out: Path, study: str, scale: str) -> None:
        self.path = out / STATE_FILE
        self.data: dict = {"study": study, "scale": scale, "runs": {}}
        if self.path.is_file():
            self._read(study, scale)

    def _read(self, study: str, scale: str) -> None:
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            runs = saved["runs"]
            if not isinstance(runs, dict) or not all(isinstance(v, dict) for v in runs.values()):
                raise TypeError("runs must be a mapping of objects")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise StudyError(
                f"{self.path} is unreadable ({type(err).__name__}): it is the study's record "
                "of its runs; restore it, or start the study again in a new --out"
            ) from None
        if (saved.get("study"), saved.get("scale")) != (study, scale):
            raise StudyError(
                f"{self.path.parent} holds the study {saved.get('study')!r} at scale "
                f"{saved.get('scale')!r}, not {study!r} at {scale!r}: choose another --out"
            )
        self.data = saved

    def check_settings(self, run: PlannedRun) -> None:
        """Refuse a run recorded with other settings than the study gives it now: another
        preset or overrides, or the same ones resolving to other values (the preset file or
        ragen's defaults changed since it started). A setting that one side lacks (a key
        ragen added or removed since) is not compared, nor one of BOOKKEEPING (how often it
        checkpoints, what it logs to)."""
        saved = self.data["runs"].get(run_key(run))
        if saved is None:
            return
        asked = {"preset": run.preset, "overrides": compared(run.overrides)}
        overrides = saved.get("overrides")
        recorded = {
            "preset": saved.get("preset"),
            "overrides": compared(overrides) if isinstance(overrides, list) else overrides,
        }
        if recorded != asked:
            raise StudyError(
                f"{run.root} was run with {recorded}, but the study now asks for {asked}: "
                "undo the change to the study file, or run it in a new --out"
            )
        before = saved.get("settings")
        if not isinstance(before, dict):
            return  # recorded by a ragen that did not keep the settings
        now = _as_json(run.settings())
        changed = changed_settings(before, now)
        if changed:
            shown = ", ".join(f"{k} {before[k]!r} → {now[k]!r}" for k in changed[:MAX_SHOWN])
            more = f" and {len(changed) - MAX_SHOWN} more" if len(changed) > MAX_SHOWN else ""
            raise StudyError(
                f"{run.root} was run with settings that {run.preset!r} and its overrides no "
                f"longer give: {shown}{more} (the preset or ragen's defaults changed since): "
                "undo that change, or run the study in a new --out"
            )

    def entry(self, run: PlannedRun) -> dict:
        """What study.json records of ``run`` (empty before it first starts)."""
        return self.data["runs"].get(run_key(run), {})

    def is_done(self, run: PlannedRun) -> bool:
        return self.entry(run).get("status") == "done"

    def minutes(self, run: PlannedRun) -> float | None:
        return self.entry(run).get("minutes")

    def mark(self, run: PlannedRun, status: str, **extra) -> None:
        if run_key(run) not in self.data["runs"]:
            self.data["runs"][run_key(run)] = {
                "preset": run.preset,
                "overrides": list(run.overrides),
                "minutes": 0.0,
                "settings": _as_json(run.settings()),
            }
        entry = self.data["runs"][run_key(run)]
        entry.update(status=status, at=datetime.now(UTC).isoformat(timespec="seconds"), **extra)
        with RunDir(self.path.parent).writing(self.path, then=AGAIN):
            write_atomic(self.path, json.dumps(self.data, indent=1) + "\n")


MAX_SHOWN = 5
"""Changed settings a refusal names (then how many more)."""


def _as_json(settings: dict) -> dict:
    """``settings`` as study.json gives them back (tuples as lists, paths as text)."""
    return json.loads(json.dumps(settings, default=str))


def set_aside(root: Path) -> Path:
    """Move a run folder that holds no checkpoint to ``NAME.incomplete-N`` (the first free
    N): it has nothing to resume from, and its logs stay readable."""
    n = 1
    while (aside := root.with_name(f"{root.name}.incomplete-{n}")).exists():
        n += 1
    root.rename(aside)
    return aside


def run_all(
    planned: list[PlannedRun],
    out: Path,
    *,
    study: str,
    scale: str,
    launch: Launch = launch_process,
    say: Callable[[str], None] = print,
    keep_checkpoints: bool = False,
    adopt_from: Path | None = None,
) -> StudyState:
    """Run every planned run not yet done, in order; returns the state once all are.
    First, with ``adopt_from``, the finished runs that folder keeps logs of are adopted
    (adopt.py). A run that finishes loses its checkpoints unless ``keep_checkpoints``. Raises
    StudyError at the first run that fails, RunDirError if another process runs a study in
    ``out`` or a write fails (a full disk)."""
    with hold(RunDir(out)):  # creates ``out``
        state = StudyState(out, study, scale)
        for run in planned:
            state.check_settings(run)  # all refused before any run starts
        if adopt_from is not None:
            from ragen.study.adopt import adopt  # it reads this module's study record

            adopt(planned, state, adopt_from, say)
        for i, run in enumerate(planned, 1):
            head = f"[study {i}/{len(planned)}] {run.label}"
            if state.is_done(run):
                say(f"{head}: done before, kept ({run.root})")
                continue
            _check_not_running(run)
            resume = bool(complete_checkpoints(RunDir(run.root)))
            if run.warm_from is not None and not resume:
                _check_warm_start(run)
            if run.root.exists() and not resume:
                say(f"{head}: {run.root} has no checkpoint; set aside as {set_aside(run.root)}")
                state.mark(run, "running", minutes=0.0)  # what it spent starts again
            say(f"{head}: {shlex.join(['ragen', *command_line(run, resume)])}")
            left = time_left(planned, state)
            if left is not None:
                say(f"{head}: {left.line()}")
            before = state.minutes(run) or 0.0
            state.mark(run, "running")
            mark_time = partial(_mark_time, state, run, before, time.monotonic())
            try:
                with ticking(mark_time, TICK_S):
                    status = launch(run, resume)
            finally:
                mark_time()
            if status != 0:
                state.mark(run, "failed", exit_status=status)
                ended = f"ended with {exit_reason(status)}" if status > 0 else exit_reason(status)
                raise StudyError(
                    f"{run.label} {ended} (its output is above)"
                    + (OUT_OF_MEMORY if status == -signal.SIGKILL else "")
                    + "; finished runs are kept: fix the cause and run the same `ragen study` "
                    "command again to go on from this run"
                )
            state.mark(run, "done")
            if not keep_checkpoints and run.command != SFT:  # the runs start from a warm start's
                _drop_checkpoints(RunDir(run.root), say)
    return state


OUT_OF_MEMORY = (
    ": on Linux most often the kernel's out-of-memory killer (`dmesg` names it), when other "
    "jobs share the memory a step needs (docs/performance.md: a step's peak)"
)
"""What a study adds when a run was killed by SIGKILL."""


def exit_reason(status: int) -> str:
    """How a run's process ended, from its exit status as `subprocess` gives it (a signal
    as its negated number): "exit status 130", "killed by SIGKILL"."""
    if status >= 0:
        return f"exit status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    return f"killed by {name}"


def _mark_time(state: StudyState, run: PlannedRun, before: float, started: float) -> None:
    """Record ``run``'s minutes so far: ``before`` (its earlier launches) and those since
    ``started`` (a `time.monotonic` reading)."""
    state.mark(run, "running", minutes=round(before + (time.monotonic() - started) / 60, 2))


TICK_S = 60.0
"""How often a running run's minutes are written to study.json while it runs, so that a
study killed outright (the machine stopped, SIGKILL) still counts its time to within this."""


@contextmanager
def ticking(tick: Callable[[], None], every: float) -> Iterator[None]:
    """Call ``tick`` every ``every`` seconds from a thread while the body runs; the thread is
    joined before the body's exit goes on. A tick that raises ends the ticking (the caller's
    own write after the body reports what failed)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            try:
                tick()
            except Exception:  # a full disk, say: the write after the body says so
                return

    thread = threading.Thread(target=loop, name="study-minutes", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@dataclass(frozen=True)
class TimeLeft:
    """What the runs not yet done will take, and what that is judged from."""

    minutes: float
    here: bool
    """Paced by runs done on this machine alone; False when some kind of run (a warm start,
    a run) has none done here yet and is paced by those done elsewhere or unrecorded."""

    def line(self) -> str:
        """The line the study and its status print: "about 8.3 h left at the pace of …"."""
        pace = "on this machine" if self.here else "(some elsewhere: this machine may differ)"
        return f"about {self.minutes / 60:.1f} h left at the pace of the runs done {pace}"


def time_left(
    planned: list[PlannedRun], state: StudyState, cpu: dict | None = None
) -> TimeLeft | None:
    """The minutes the runs not yet done will take if each takes the mean of the done runs
    of its name at other seeds (a PPO run costs more than a GRPO one), or, while none is
    done, of its command (a warm start is a few minutes, a run tens); of those, the ones
    that ran on this machine's ``cpu`` (`this_cpu`; their machine.jsonl), or all while none
    did: a study that moved to another machine is paced by what it does there. Less the
    minutes a run under way has spent (up to that mean). None until each command with a
    run left has one done."""
    cpu = this_cpu() if cpu is None else cpu
    done = [p for p in planned if state.is_done(p)]
    local = {p.root for p in done if ran_only_on(RunDir(p.root).machine, cpu)}
    left, here = 0.0, True
    for run in (p for p in planned if not state.is_done(p)):
        pool = [p for p in done if p.name == run.name] or [
            p for p in done if p.command == run.command
        ]
        if not pool:
            return None
        paced = [p for p in pool if p.root in local]
        here = here and bool(paced)
        paced = paced or pool
        mean = sum(state.minutes(p) or 0.0 for p in paced) / len(paced)
        left += mean - min(state.minutes(run) or 0.0, mean)
    return TimeLeft(left, here)


def _check_not_running(run: PlannedRun) -> None:
    """Refuse to touch ``run``'s folder (set it aside, resume it, start it) while a process
    holds its writer lock: a run an earlier study left running, or one started by hand."""
    busy = holder(RunDir(run.root))
    if busy is not None:
        raise StudyError(
            f"{run.root} is being written by {busy}: a run of an earlier `ragen study`, or "
            "one started by hand, is still going; the study leaves its folder as it is: "
            "wait for it to end or stop it, then run the same `ragen study` command again"
        )


def _check_warm_start(run: PlannedRun) -> None:
    """Refuse to start ``run`` when its warm start's last checkpoint is not there."""
    assert run.warm_from is not None
    if not (run.warm_from / "config.json").is_file():
        warm = run.warm_from.parent.parent
        raise StudyError(
            f"{run.label} starts from {run.warm_from}, which is not there: its warm start "
            f"({warm}) ended before its last step (trainer.max_minutes?) or lost its "
            "checkpoints; move that folder aside, remove its entry from "
            f"{STATE_FILE}, and run the same `ragen study` command again to redo it"
        )


def _drop_checkpoints(run: RunDir, say: Callable[[str], None]) -> None:
    """Remove a finished run's checkpoints, and those of its own warm start
    (``sft.warm_start``), saying how much space that gave back."""
    folders = [f for f in (run.checkpoints, run.warm_start.checkpoints) if f.is_dir()]
    if not folders:
        return
    size = sum(f.stat().st_size for folder in folders for f in folder.rglob("*") if f.is_file())
    for folder in folders:
        shutil.rmtree(folder)
    say(f"removed its checkpoints ({size / 2**30:.1f} GiB; --keep-checkpoints keeps them)")
