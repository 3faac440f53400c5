"""The run directory: its layout, its creation, and the one-line refusal of a failed write.

Layout (read by `ragen report`, the viewer and the tests)::

    RUN_DIR/config.yaml            the resolved config, loadable again as a preset
    RUN_DIR/metrics.jsonl          one object per step: {"step": 3, "rollout/success": 0.25, ...}
    RUN_DIR/trajectories/step_000003.jsonl   one object per episode
    RUN_DIR/eval.jsonl             one object per evaluation and env: {"step": 9, "env": ...};
                                   step -1 (BEFORE_TRAINING) is the starting policy's
    RUN_DIR/alerts.jsonl           collapse warnings
    RUN_DIR/checkpoints/step_000050/
    RUN_DIR/tb/                    TensorBoard events
    RUN_DIR/warm_start/            with sft.warm_start: the `ragen sft` stage RL started from,
                                   a run directory of its own, and its stage.json once it ended

A folder `ragen eval --out` writes holds eval.jsonl (its summary), trajectories/eval.jsonl
(its episodes) and eval-config.yaml: the resolved config it played by, its seeds, tries,
temperature and split those of the command (not named config.yaml: it trained nothing).

Every write is a whole line, flushed and fsynced before the call returns, so a run killed at
any moment keeps every completed step; a reader skips the torn last line of a killed run.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from safetensors import SafetensorError

from ragen.config import PRESET_SUFFIX, Config, to_yaml
from ragen.run.jsonl import RunDirError, write_atomic

BEFORE_TRAINING = -1
"""The step of an evaluation made before the first update (``trainer.eval_before``)."""

WARM_START = "warm_start"
"""The folder of a run's warm start (``sft.warm_start``) inside the run directory."""

STAGE_RECORD = "stage.json"
"""A warm start's record, written once its last checkpoint is saved: ``checkpoint`` (the
folder RL starts from), ``steps``, ``minutes`` (its wall time), ``rl_max_minutes`` (the RL
stage's budget); see ragen.train.warm_start."""

SEED_SUCCESSES = "seed_successes"
"""The eval.jsonl key of an evaluation's levels' successes: a list, one count in [0, k] a seed
(read level by level in ragen.report.paired)."""


@dataclass(frozen=True)
class RunDir:
    """Paths of one run's files; creating the object touches nothing."""

    root: Path
    command: str = field(default="train", compare=False)
    """The `ragen` command that wrote this run (``train`` or ``sft``)."""
    parent: Path | None = field(default=None, compare=False)
    """The run whose warm start this run is: resuming that one continues this one."""

    @property
    def resume_line(self) -> str:
        """The command that continues this run (named in write-error messages)."""
        if self.parent is not None:
            return f"ragen train --resume {self.parent}"
        return f"ragen {self.command} --resume {self.root}"

    @property
    def warm_start(self) -> RunDir:
        """The run's warm start (``sft.warm_start``), there or not."""
        return RunDir(self.root / WARM_START, command="sft", parent=self.root)

    @property
    def stage_record(self) -> Path:
        return self.root / STAGE_RECORD

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def evals(self) -> Path:
        return self.root / "eval.jsonl"

    @property
    def machine(self) -> Path:
        """Where the run ran, a line per start (machine.py)."""
        return self.root / "machine.jsonl"

    @property
    def alerts(self) -> Path:
        return self.root / "alerts.jsonl"

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tb"

    @property
    def lock(self) -> Path:
        """The writer lock (see lock.py)."""
        return self.root / ".lock"

    def trajectory_file(self, step: int) -> Path:
        return self.trajectories / f"step_{step:06d}.jsonl"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def check_new(self) -> None:
        """Refuse a folder that exists with something in it (but the writer lock): resuming
        is an explicit, separate act."""
        if self.root.exists() and (
            not self.root.is_dir() or any(p != self.lock for p in self.root.iterdir())
        ):
            raise RunDirError(
                f"run directory {self.root} already exists and is not empty: "
                "choose another --out, or resume it with --resume"
            )

    def check_writable(self) -> None:
        """Refuse, before any work, a run directory that cannot be written (a full or
        read-only disk, a folder without permission, a name too long): RunDirError with
        `writing`'s line. One block is written and fsynced in the nearest folder that
        exists, as a file without a name, so nothing is left whatever happens; the run
        directory itself is not created."""
        with self.writing(self.root, then="run again"):
            folder = self.root
            while not folder.exists():
                folder = folder.parent
            with tempfile.TemporaryFile(dir=folder) as probe:
                probe.write(bytes(PROBE_BYTES))
                probe.flush()
                os.fsync(probe.fileno())

    @contextmanager
    def writing(self, path: Path, *, then: str | None = None) -> Iterator[None]:
        """Turn a failed write of ``path`` (a full disk, no permission, a file size limit)
        into one line saying what to do; ``then`` is the command to run after the fix."""
        try:
            yield
        except WRITE_ERRORS as err:
            then = then or self.resume_line
            raise RunDirError(
                f"cannot write {path}: {_write_reason(err)}; {_fix(err, then)}"
            ) from err


PROBE_BYTES = 4096
"""What `RunDir.check_writable` writes: one block, the least any file holding data takes."""

NAME_MAX = 255
"""The longest file or folder name, in bytes, that Linux file systems (ext4, xfs, btrfs,
tmpfs) take; a longer one fails with ENAMETOOLONG."""

DISK_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.ENAMETOOLONG}
)
"""OSErrors the user's disk or paths cause, not ragen: a full disk or quota, a file size
limit, a read-only disk, a folder without permission, a name too long."""

WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)
"""What a failed write raises: OSError from Python's own files; RuntimeError from torch.save
and SafetensorError from safetensors, whose writers report a short write as such."""


def _write_reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    lines = str(err).strip().splitlines()
    return lines[-1] if lines else type(err).__name__


def _fix(err: BaseException, then: str) -> str:
    """What to do about a failed write: a shorter name, a writable disk, or room and
    permission; then ``then``."""
    if isinstance(err, OSError) and err.errno == errno.ENAMETOOLONG:
        return f"a file or folder name may have at most {NAME_MAX} bytes: choose a shorter one"
    if isinstance(err, OSError) and err.errno == errno.EROFS:
        return f"remount the disk writable or choose a folder on another, then {then}"
    return f"free space or fix permissions, then {then}"


def disk_error_line(err: OSError) -> str | None:
    """One line saying what to do about ``err`` if the disk or a path caused it (see
    DISK_ERRNOS), for the CLI to print in place of a traceback; None for any other error."""
    if err.errno not in DISK_ERRNOS:
        return None
    where = f" {err.filename}" if err.filename is not None else ""
    return f"cannot use{where}: {err.strerror}; {_fix(err, 'run again')}"


def check_metrics(run: RunDir) -> None:
    """Refuse a folder without metrics.jsonl (a metrics.jsonl that is not a readable file is
    refused by read_jsonl)."""
    if not run.metrics.exists():
        raise RunDirError(f"{run.root} is not a run directory with metrics (no metrics.jsonl)")


def eval_files(out: Path) -> tuple[Path, Path, Path]:
    """(summary file, episode file, config file) of a standalone evaluation in ``out``."""
    run = RunDir(out)
    return run.evals, run.trajectories / "eval.jsonl", run.root / "eval-config.yaml"


def check_eval_out(out: Path) -> None:
    """Refuse, before the model loads, an output folder that cannot be written (a full or
    read-only disk, a name too long), that already holds an evaluation's episodes, or that
    is a training run's (its eval.jsonl is the run's own)."""
    run = RunDir(out)
    run.check_writable()
    _, episodes, _ = eval_files(out)
    if episodes.exists():
        raise RunDirError(f"{episodes} already exists: choose another --out")
    if run.config.exists() or run.metrics.exists():
        raise RunDirError(f"{out} is a training run's folder: choose another --out")


def default_run_root(preset: str, now: datetime | None = None) -> Path:
    """``runs/<preset name>-<UTC time>``; a preset file contributes its stem, and the
    punctuation of a user env's ``package.module:Class`` becomes dashes."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    name = Path(preset).stem if preset.endswith(PRESET_SUFFIX) else preset
    return Path("runs") / f"{re.sub(r'[^A-Za-z0-9_-]+', '-', name)}-{stamp}"


def create_run_dir(root: str | Path, config: Config) -> RunDir:
    """Make a fresh run directory holding the resolved config.

    Call only with a validated config, so a refused config never leaves a folder behind.
    An existing non-empty folder is refused: resuming is an explicit, separate act.
    """
    run = RunDir(Path(root))
    run.check_new()
    with run.writing(run.config, then="run again"):
        run.root.mkdir(parents=True, exist_ok=True)
        # the config first: a folder left by a failed write stays empty, so usable again
        write_atomic(run.config, to_yaml(config))
        for folder in (run.trajectories, run.checkpoints):
            folder.mkdir(exist_ok=True)
    return run


def rewrite_config(run: RunDir, config: Config) -> None:
    """Replace a run's config.yaml (a resumed run with overrides records what it runs)."""
    with run.writing(run.config):
        write_atomic(run.config, to_yaml(config))


def read_stage_record(stage: RunDir) -> dict | None:
    """A warm start's ``stage.json`` (see STAGE_RECORD): None while the stage has not ended;
    RunDirError, saying how to record it again, when the file is damaged."""
    path = stage.stage_record
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    numbers = ("steps", "minutes", "rl_max_minutes")
    if not (
        isinstance(record, dict)
        and isinstance(record.get("checkpoint"), str)
        and all(type(record.get(k)) in (int, float) for k in numbers)
    ):
        raise RunDirError(
            f"{path} is damaged: it records the checkpoint RL starts from; delete it, and "
            f"{stage.resume_line} records it again from the warm start's last checkpoint"
        )
    return record
