"""The run directory and the append-only logs inside it.

Layout (read by `ragen report`, the viewer and the tests)::

    RUN_DIR/config.yaml            the resolved config, loadable again as a preset
    RUN_DIR/metrics.jsonl          one object per step: {"step": 3, "rollout/success": 0.25, ...}
    RUN_DIR/trajectories/step_000003.jsonl   one object per episode
    RUN_DIR/eval.jsonl             one object per evaluation
    RUN_DIR/alerts.jsonl           collapse warnings
    RUN_DIR/checkpoints/step_000050/
    RUN_DIR/tb/                    TensorBoard events

Every write is a whole line, flushed and fsynced before the call returns, so a run killed at
any moment keeps every completed step; a reader skips the torn last line of a killed run.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from ragen.config import Config, to_yaml


class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message says what to do."""


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
    """``runs/<preset name>-<UTC time>``; a path-like preset contributes its file stem."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{Path(preset).stem}-{stamp}"


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


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` whole or not at all (write aside, fsync, rename); a
    failed write leaves the old file and no temporary one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _json_safe(value: Any) -> Any:
    # JSON has no NaN or Infinity (browsers refuse them): a non-finite number is written null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy and torch scalars
        return _json_safe(value.item())
    return value


def to_json_line(record: dict) -> str:
    """One compact JSON line (no trailing newline); non-finite floats become null."""
    return json.dumps(_json_safe(record), ensure_ascii=False, separators=(",", ":"))


def append_jsonl(path: Path, records: Iterable[dict]) -> int:
    """Append records as lines, then flush and fsync; returns how many were written."""
    lines = [to_json_line(r) + "\n" for r in records]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        _heal_torn_tail(fh, path)
        fh.writelines(lines)
        fh.flush()
        os.fsync(fh.fileno())
    return len(lines)


def _heal_torn_tail(fh, path: Path) -> None:
    # A run killed mid-write leaves a last line without "\n"; start ours on a fresh line so
    # the torn line stays alone (and skipped) instead of swallowing the next record.
    size = path.stat().st_size
    if size:
        with open(path, "rb") as probe:
            probe.seek(size - 1)
            if probe.read(1) != b"\n":
                fh.write("\n")


def rewrite_jsonl(path: Path, records: Iterable[dict]) -> None:
    """Replace a JSONL file's content atomically (write aside, fsync, rename)."""
    write_atomic(path, "".join(to_json_line(r) + "\n" for r in records))


@dataclass
class JsonlRead:
    """Records of a JSONL file plus the line numbers that could not be parsed."""

    records: list[dict]
    skipped: list[int]


# A number past a float's range (1.8e308) is written with a three-digit exponent or a run of
# 100+ digits; with every digit read as "0" and "E" as "e", one regex finds either at C speed.
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789E", b"0000000000e")
_BIG_NUMBER = re.compile(rb"0(?:e\+?000|0{99})")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_line(line: bytes, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """One JSONL line as Python; ValueError for a line readers must skip as torn.

    Besides what json.loads refuses (not JSON, not UTF-8, an int past Python's 4,300-digit
    limit, nesting past the recursion limit), two things it accepts break every later use:
    a lone surrogate (``"\\ud800"`` has no UTF-8 form, so no page or file can hold it) and a
    number past a float's range (``1e999`` reads as inf, which JSON cannot write; a 400-digit
    int overflows ``float()``). Each needs a tell-tale in the raw line, so only lines with one
    are looked at again and reading stays at json.loads' speed. ``parse_constant`` is
    json.loads' (what NaN and Infinity become).
    """
    try:
        value = json.loads(line, parse_constant=parse_constant)
    except RecursionError as err:
        raise ValueError("nested too deeply") from err
    if _BIG_NUMBER.search(line.translate(_DIGITS_AS_ZERO)):
        json.loads(line, parse_float=_float_in_range, parse_int=_int_in_float_range)
    if _SURROGATE_ESCAPE.search(line):
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError: a lone one
    return value


def _float_in_range(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:20]} is past a float's range")
    return value


def _int_in_float_range(text: str) -> int:
    value = int(text)
    if abs(value) > sys.float_info.max:
        raise ValueError(f"{text[:20]} is past a float's range")
    return value


def read_jsonl(path: str | Path) -> JsonlRead:
    """Read every well-formed object line; torn or junk lines (see `parse_line`) are skipped
    and counted. A missing file reads as empty; RunDirError if the path cannot be read."""
    records, skipped = [], []
    path = Path(path)
    if not path.exists():
        return JsonlRead(records, skipped)
    try:
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = parse_line(line)
                except ValueError:
                    record = None
                if isinstance(record, dict):
                    records.append(record)
                else:
                    skipped.append(number)
    except OSError as err:
        raise RunDirError(
            f"cannot read {path} ({err.strerror or err}): it must be a readable JSONL file"
        ) from err
    return JsonlRead(records, skipped)


class MetricsLogger:
    """Writes each step's metrics to metrics.jsonl, TensorBoard and (if asked) W&B.

    ``log`` returns only after the line is on disk, so the file always holds every
    completed step.
    """

    def __init__(
        self,
        run: RunDir,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "ragen",
        config: dict | None = None,
    ) -> None:
        self.run = run
        self._tb = None
        self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run.tensorboard))
        if wandb:
            import wandb as wandb_lib  # optional extra; config validation checked it exists

            self._wandb = wandb_lib.init(
                project=wandb_project, dir=str(run.root), name=run.root.name, config=config
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": int(step), "time": round(time.time(), 3), **metrics}
        append_jsonl(self.run.metrics, [record])
        numeric = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def log_episodes(self, step: int, episodes: Iterable[dict]) -> int:
        """Write one step's episodes to trajectories/step_NNNNNN.jsonl."""
        return append_jsonl(self.run.trajectory_file(step), episodes)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
