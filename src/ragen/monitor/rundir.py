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

Every write is a whole line, flushed and fsynced before the call returns, so a run killed at
any moment keeps every completed step; a reader skips the torn last line of a killed run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from safetensors import SafetensorError

from ragen.config import PRESET_SUFFIX, Config, to_yaml
from ragen.monitor.jsonl import RunDirError, write_atomic

BEFORE_TRAINING = -1
"""The step of an evaluation made before the first update (``trainer.eval_before``)."""


@dataclass(frozen=True)
class RunDir:
    """Paths of one run's files; creating the object touches nothing."""

    root: Path
    command: str = field(default="train", compare=False)
    """The `ragen` command that resumes this run (named in write-error messages)."""

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
        """The writer lock (see runlock.py)."""
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

    @contextmanager
    def writing(self, path: Path, *, then: str | None = None) -> Iterator[None]:
        """Turn a failed write of ``path`` (a full disk, no permission, a file size limit)
        into one line saying what to do; ``then`` is the command to run after the fix."""
        try:
            yield
        except WRITE_ERRORS as err:
            then = then or f"ragen {self.command} --resume {self.root}"
            raise RunDirError(
                f"cannot write {path}: {_write_reason(err)}; free space or fix permissions, "
                f"then {then}"
            ) from err


WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)
"""What a failed write raises: OSError from Python's own files; RuntimeError from torch.save
and SafetensorError from safetensors, whose writers report a short write as such."""


def _write_reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    lines = str(err).strip().splitlines()
    return lines[-1] if lines else type(err).__name__


def check_metrics(run: RunDir) -> None:
    """Refuse a folder without metrics.jsonl (a metrics.jsonl that is not a readable file is
    refused by read_jsonl)."""
    if not run.metrics.exists():
        raise RunDirError(f"{run.root} is not a run directory with metrics (no metrics.jsonl)")


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
