"""What the viewer's page asks of a run directory, answered from its files.

Every path is built here from validated integers (``RunDir.trajectory_file``) or fixed
names; no string from a request is ever joined into a path, so no request can reach a file
outside the run directory. Nor can the run directory itself: every file is opened first and
checked after (see `files.open_inside`), so one that resolves elsewhere (a symlink out of
it, even one swapped in mid-request) or is not a regular file (a FIFO) is never read, and
the page says what was left out. Everything is read on demand and cached by file stamp, so a
run still training shows its new steps without a restart; what is kept and what one answer
holds are bounded in bytes (index.py, GROUP_RESPONSE_CHARS, SMALL_FILE_BYTES).
"""

from __future__ import annotations

import io
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from ragen import metric_names as names
from ragen.agent.parsing import PROBLEMS
from ragen.config import ConfigError, yaml_mapping
from ragen.run.jsonl import JsonlRead, RunDirError, parse_jsonl
from ragen.run.rundir import RunDir
from ragen.viewer.files import Refused, outside_notice, read_inside, size_text
from ragen.viewer.index import (
    MAX_LINE_BYTES,
    FileIndex,
    IndexCache,
    as_float,
    as_int,
    as_str,
    turns_of,
)

StepKey = int | Literal["eval"]
EVAL: Final = "eval"
MAX_STEP = 999_999_999
_STEP_FILE = re.compile(r"step_([0-9]{6,9})\.jsonl")
_STEP_TEXT = re.compile(r"[0-9]{1,9}")

# Per-step numbers sent to the step list: the three charts plus a few table columns. The
# full metrics line has ~50 keys; a live page polls, so it gets only these.
STEP_KEYS = (
    names.SUCCESS,
    names.REWARD_MEAN,
    names.REWARD_STD,
    names.FORMAT_OK,
    names.TURNS_PER_EPISODE,
    names.REPLY_TOKENS,
    names.KEPT_GROUPS,
)
MAX_BUCKETS = 64
"""The most gradient-reporter buckets the page is sent (a run logs the configured count + 1)."""
EVAL_KEYS = ("step", "env", "model", "episodes", "success", "pass_at_k", "reward_mean", "format_ok")
GROUP_VIEW_DEFAULT_STEPS = 6
GROUP_VIEW_MAX_STEPS = 24
GROUP_REPLY_CHARS = 4000  # a reply in the side-by-side view; the dialogue view shows it all
GROUP_RESPONSE_CHARS = 2_000_000
"""Reply characters one over-time answer holds, all columns together; episodes past it are
counted (``omitted``), not sent."""
SMALL_FILE_BYTES = 64 * 2**20
"""The largest metrics, alerts, evals or config file the viewer reads."""
MAX_PAGE = 500


class NotFound(LookupError):
    """A step or episode the run does not have; the message names what exists."""


def parse_step(text: str) -> StepKey:
    """``"eval"`` or a step number written in at most 9 ASCII digits; else ValueError."""
    if text == EVAL:
        return EVAL
    if not _STEP_TEXT.fullmatch(text):
        raise ValueError(f"step must be a number from 0 to {MAX_STEP} or 'eval', not {text!r}")
    return int(text)


def parse_steps(text: str) -> list[int]:
    """A comma-separated list of step numbers ("0,5,10"); ValueError names the bad piece."""
    steps = []
    for piece in text.split(","):
        piece = piece.strip()
        if not piece:
            continue
        step = parse_step(piece)
        if step == EVAL:
            raise ValueError("the over-time view takes training steps, not 'eval'")
        steps.append(step)
    if len(steps) > GROUP_VIEW_MAX_STEPS:
        raise ValueError(f"at most {GROUP_VIEW_MAX_STEPS} steps side by side")
    return sorted(set(steps))


@dataclass(frozen=True)
class EpisodeQuery:
    """Filters and page of the step view. ``text`` is matched case-insensitively in replies."""

    env: str | None = None
    success: bool | None = None
    end: str | None = None
    text: str = ""
    group: int | None = None
    offset: int = 0
    limit: int = 100

    def matches(self, index: FileIndex, i: int) -> bool:
        s = index.summaries[i]
        return (
            (self.env is None or s.env == self.env)
            and (self.success is None or s.success == self.success)
            and (self.end is None or s.end == self.end)
            and (self.group is None or s.group == self.group)
            and (not self.text or self.text.lower() in index.texts[i])
        )


def inside(path: Path, root: Path) -> bool:
    """Whether ``path``, symlinks followed, lies in ``root`` (an absolute, resolved path);
    False when it cannot be resolved (it is being replaced). For listing only: reads go
    through `files.open_inside`, which checks what was actually opened."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(root)
    except OSError:
        return False


class _CachedJsonl:
    """A small JSONL file (metrics, alerts, evals) re-read only when its stamp changes."""

    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.root = path, root
        self._stamp: tuple | None = None
        self._read: tuple[JsonlRead, str | None] = (JsonlRead([], []), None)
        self._lock = threading.Lock()

    def get(self) -> tuple[JsonlRead, str | None]:
        """The file's records, and a notice saying what was left out (None: nothing)."""
        with self._lock:
            stamp = _stamp(self.path)  # follows a symlink: a new target is a new stamp
            if stamp != self._stamp:
                self._read, self._stamp = self._load(), stamp
            return self._read

    def _load(self) -> tuple[JsonlRead, str | None]:
        name = self.path.name
        try:
            data = read_inside(self.path, self.root, name, SMALL_FILE_BYTES)
        except FileNotFoundError:
            return JsonlRead([], []), None
        except Refused as err:
            return JsonlRead([], []), str(err)
        except OSError as err:
            return JsonlRead([], []), f"cannot read {name} ({err.strerror or err})"
        read = parse_jsonl(io.BytesIO(data))
        return read, (_skip_notice(name, read.skipped) if read.skipped else None)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class RunStore:
    """Reads one run directory for the viewer. Thread-safe; holds only indexes in memory."""

    def __init__(self, root: str | Path) -> None:
        self.run = RunDir(Path(root).resolve())
        check_run_dir(self.run)
        self.indexes = IndexCache(self.run.root)
        self._metrics = _CachedJsonl(self.run.metrics, self.run.root)
        self._alerts = _CachedJsonl(self.run.alerts, self.run.root)
        self._evals = _CachedJsonl(self.run.evals, self.run.root)

    # ------------------------------------------------------------------ paths

    def trajectory_path(self, step: StepKey) -> Path:
        if step == EVAL:
            return self.run.trajectories / "eval.jsonl"
        if not isinstance(step, int) or not 0 <= step <= MAX_STEP:
            raise ValueError(f"not a step number: {step!r}")
        return self.run.trajectory_file(step)

    def episode_steps(self) -> list[int]:
        """Training steps that have a trajectories file (inside the run), ascending."""
        return self._step_files()[0]

    def _step_files(self) -> tuple[list[int], list[str]]:
        """The steps of `episode_steps`, and the names of trajectories files (or of the
        folder) that link outside the run directory: those are never read."""
        folder = self.run.trajectories
        if not inside(folder, self.run.root):
            return [], [folder.name]
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return [], []
        steps, outside = [], []
        for entry in entries:
            if match := _STEP_FILE.fullmatch(entry.name):
                # only a symlink can lead out: a plain entry skips the realpath call
                if entry.is_symlink() and not inside(Path(entry.path), self.run.root):
                    outside.append(f"{folder.name}/{entry.name}")
                else:
                    steps.append(int(match[1]))
        return sorted(steps), sorted(outside)

    def has_eval_episodes(self) -> bool:
        path = self.trajectory_path(EVAL)
        return path.is_file() and inside(path, self.run.root)

    def index(self, step: StepKey) -> FileIndex:
        index = self.indexes.get(self.trajectory_path(step))
        if index.refused:
            raise NotFound(index.refused)
        if not index.exists:
            raise NotFound(f"no episodes saved for step {step}: {self._have()}")
        return index

    def _have(self) -> str:
        steps = self.episode_steps()
        if not steps:
            return "this run has no trajectories files yet"
        return f"steps with episodes run from {steps[0]} to {steps[-1]} ({len(steps)} files)"

    # ------------------------------------------------------------------ answers

    def version(self) -> str:
        """Changes whenever a file the step list shows changes (polled by a live page)."""
        parts = [
            _stamp(p)
            for p in (self.run.metrics, self.run.alerts, self.run.evals, self.run.trajectories)
        ]
        steps = self.episode_steps()
        if steps:
            parts.append(_stamp(self.run.trajectory_file(steps[-1])))
        return str(abs(hash(tuple(parts))))

    def overview(self) -> dict:
        """Run name, config summary, per-step metrics, alerts, evals and notices."""
        (metrics, metrics_notice), (alerts, alerts_notice), (evals, evals_notice) = (
            self._metrics.get(),
            self._alerts.get(),
            self._evals.get(),
        )
        config, config_notice = self._config()
        steps, outside = self._step_files()
        found = [metrics_notice, alerts_notice, evals_notice, config_notice]
        notices = [n for n in found if n] + [outside_notice(name) for name in outside]
        with_episodes = set(steps)
        rows = {}
        for record in metrics.records:
            step = as_int(record.get("step"))
            if step >= 0:
                rows[step] = {"step": step, **{k: as_float(record.get(k)) for k in STEP_KEYS}}
        for step in with_episodes - set(rows):
            rows[step] = {"step": step, **dict.fromkeys(STEP_KEYS)}
        return {
            "name": self.run.root.name,
            "config": config,
            "steps": [{**rows[s], "episodes": s in with_episodes} for s in sorted(rows)],
            "eval_episodes": self.has_eval_episodes(),
            "alerts": [_alert(r) for r in alerts.records],
            "evals": [_eval(r) for r in evals.records],
            "gradients": _gradients(metrics.records),
            "problems": PROBLEMS,
            "notices": notices,
            "version": self.version(),
        }

    def episodes(self, step: StepKey, query: EpisodeQuery) -> dict:
        """One page of the episodes matching ``query``, with facet counts and notices."""
        index = self.index(step)
        matched = [i for i in range(len(index.summaries)) if query.matches(index, i)]
        limit = max(1, min(query.limit, MAX_PAGE))
        offset = max(0, query.offset)
        page = matched[offset : offset + limit]
        return {
            "step": step,
            "total": len(index.summaries),
            "matched": len(matched),
            "offset": offset,
            "limit": limit,
            "items": [index.summaries[i].to_json() for i in page],
            "envs": dict(index.envs),
            "ends": dict(index.ends),
            "groups": len(index.by_group),
            "notices": file_notices(index, self._relative(step)),
        }

    def episode(self, step: StepKey, number: int) -> dict:
        """The full record of one episode plus its summary and neighbours' indexes."""
        index = self.index(step)
        if not 0 <= number < len(index.summaries):
            raise NotFound(f"step {step} has episodes 0 to {len(index.summaries) - 1}")
        try:
            record = index.record(number)
        except (OSError, ValueError) as err:  # the file was replaced between two reads
            raise NotFound(f"step {step} changed on disk; reload the page ({err})") from err
        return {
            "step": step,
            "summary": index.summaries[number].to_json(),
            "record": record,
            "count": len(index.summaries),
        }

    def group_over_time(self, group: int, steps: list[int] | None = None) -> dict:
        """The episodes of ``group`` at several steps, replies side by side. Training seeds
        are fresh each step, so a column is the same group slot with its own seed."""
        available = self.episode_steps()
        chosen = steps if steps else spread(available, GROUP_VIEW_DEFAULT_STEPS)
        budget = GROUP_RESPONSE_CHARS // max(1, len(chosen))
        columns = []
        for step in chosen:
            if step not in available:
                columns.append({"step": step, "missing": True, "episodes": [], "omitted": 0})
                continue
            columns.append(self._group_column(self.index(step), step, group, budget))
        return {"group": group, "available": available, "columns": columns}

    # ------------------------------------------------------------------ helpers

    def _group_column(self, index: FileIndex, step: int, group: int, budget: int) -> dict:
        """The group's episodes at one step with their replies, each reply cut at
        GROUP_REPLY_CHARS, until ``budget`` reply characters are spent; the episodes left
        after that are counted in ``omitted``."""
        episodes: list[dict] = []
        members = index.by_group.get(group, [])
        for n, i in enumerate(members):
            if budget <= 0:
                return _column(step, episodes, omitted=len(members) - n)
            summary = index.summaries[i]
            try:
                record = index.record(i)
            except (OSError, ValueError):
                continue
            replies, cut = [], False
            for turn in turns_of(record):
                reply = as_str(turn.get("reply"))
                shown = reply[: min(GROUP_REPLY_CHARS, max(budget, 0))]
                budget -= len(shown)
                cut = cut or len(shown) < len(reply)
                replies.append(shown)
            episodes.append({**summary.to_json(), "replies": replies, "cut": cut})
        return _column(step, episodes, omitted=0)

    def _relative(self, step: StepKey) -> str:
        return str(self.trajectory_path(step).relative_to(self.run.root))

    def _config(self) -> tuple[dict, str | None]:
        name = self.run.config.name
        try:
            data = yaml_mapping(
                read_inside(self.run.config, self.run.root, name, SMALL_FILE_BYTES),
                self.run.config,
            )
        except FileNotFoundError:
            return {}, None
        except Refused as err:
            return {}, str(err)
        except (OSError, ConfigError):
            return {}, f"{name} could not be read; the run's settings are not shown"
        return config_summary(data), None


def _column(step: int, episodes: list[dict], omitted: int) -> dict:
    """One step of the over-time view: its episodes, the distinct reply sequences among
    them and their seeds; ``omitted`` episodes did not fit the answer's size bound."""
    distinct = len({tuple(e["replies"]) for e in episodes})
    seeds = sorted({e["seed"] for e in episodes})
    return {
        "step": step,
        "seeds": seeds,
        "distinct": distinct,
        "episodes": episodes,
        "omitted": omitted,
    }


def check_run_dir(run: RunDir) -> None:
    """Refuse a folder that is not a run directory, saying what one looks like."""
    root = run.root
    if not root.is_dir():
        raise RunDirError(
            f"{root} is not a folder: pass the run directory that `ragen train --out` "
            "or `ragen eval --out` wrote"
        )
    markers = (run.config, run.metrics, run.trajectories, run.evals)
    if not any(p.exists() for p in markers):
        raise RunDirError(
            f"{root} is not a run directory (no config.yaml, metrics.jsonl, eval.jsonl or "
            "trajectories/): pass the folder that `ragen train --out` or `ragen eval --out` wrote"
        )


def config_summary(data: dict) -> dict:
    """The few settings shown in the page header, as display strings."""

    def get(section: str, key: str) -> Any:
        part = data.get(section)
        return part.get(key) if isinstance(part, dict) else None

    fields = {
        "env": get("env", "name"),
        "model": get("model", "spec"),
        "steps": get("trainer", "steps"),
        "groups": get("rollout", "groups"),
        "group_size": get("rollout", "group_size"),
        "estimator": get("algo", "estimator"),
        "demos": get("rollout", "demos"),  # what a windowed turn's context opens with
    }
    shown = {k: str(v) for k, v in fields.items() if isinstance(v, str | int | float)}
    return {k: v for k, v in shown.items() if _encodable(v)}


def _encodable(text: str) -> bool:
    """False for text with a lone surrogate (YAML reads "\\ud800"): no response can hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def file_notices(index: FileIndex, name: str) -> list[str]:
    """What the index left out of a trajectories file, in words."""
    notices = []
    if index.skipped:
        notices.append(_skip_notice(name, index.skipped))
    if index.too_long:
        count = len(index.too_long)
        notices.append(
            f"{name}: {count} line{'s' if count > 1 else ''} over "
            f"{size_text(MAX_LINE_BYTES)} not shown (line {index.too_long[0]}"
            f"{', …' if count > 1 else ''})"
        )
    if index.torn_tail:
        notices.append(
            f"{name}: the last line is incomplete (a run killed mid-write, or a line still "
            "being written) and is not shown"
        )
    return notices


def _skip_notice(name: str, lines: list[int]) -> str:
    shown = ", ".join(str(n) for n in lines[:5]) + (", …" if len(lines) > 5 else "")
    noun = "line" if len(lines) == 1 else "lines"
    return f"{name}: {len(lines)} broken {noun} skipped (line {shown})"


def _alert(record: dict) -> dict:
    return {
        "step": as_int(record.get("step")),
        "kind": as_str(record.get("kind")),
        "signal": as_str(record.get("signal")),
        "value": as_float(record.get("value")),
        "baseline": as_float(record.get("baseline")),
        "message": as_str(record.get("message")),
    }


def _gradients(records: list[dict]) -> dict | None:
    """The gradient reporter's numbers of the last step that logged them (see
    `train.gradient_analysis`): ``{"step": s, "buckets": [[name, {quantity: value}], ...]}``,
    bucket_1 … bucket_K in order, then all; None when no step did."""
    for record in reversed(records):
        buckets: dict[str, dict[str, float | None]] = {}
        for key, value in record.items():
            parsed = names.parse_bucket_metric(key)
            if parsed and (parsed[0] in buckets or len(buckets) < MAX_BUCKETS):
                buckets.setdefault(parsed[0], {})[parsed[1]] = as_float(value)
        if buckets:
            order = sorted(buckets, key=lambda b: (b == "all", len(b), b))  # bucket_2 < bucket_10
            return {"step": as_int(record.get("step")), "buckets": [[b, buckets[b]] for b in order]}
    return None


def _eval(record: dict) -> dict:
    out: dict[str, int | float | str | None] = {}
    for key in EVAL_KEYS:
        value = record.get(key)
        if key == "step":
            out[key] = as_int(value) if value is not None else None
        elif key in ("env", "model"):
            out[key] = as_str(value)
        else:
            out[key] = as_float(value)
    return out


def spread(values: list[int], n: int) -> list[int]:
    """Up to ``n`` values picked evenly from a sorted list, always with its first and last."""
    if len(values) <= n:
        return list(values)
    picks = {values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)}
    return sorted(picks)
