"""A byte-offset index of one trajectories JSONL file.

The step view filters and pages through thousands of episodes; re-parsing the file for every
request would cost a second per click at 10,000 episodes. The index parses each line once,
keeps where it starts and ends plus the few fields the filters need, and on the next request
reads only the bytes appended since (the trainer only appends). A file replaced (resume
rewrites it) or shrunk is indexed again from the start.

A line without its ``\\n`` at the end of the file is not indexed: it is either still being
written or was torn by a killed run. Lines that are not JSON objects, or that no page could
show (see `parse_line`), are skipped and their numbers kept, so the page can say what it left
out.

Memory is bounded whatever the file holds: it is read in chunks of READ_CHUNK_BYTES, a line
longer than MAX_LINE_BYTES is skipped (and named) without being held whole, the text search
keeps at most SEARCH_CHARS characters of an episode's replies, and the cache of indexes is
bounded by the bytes those keep (CACHE_BYTES) as well as by count.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ragen.run.jsonl import parse_line
from ragen.viewer.files import Refused, open_inside

PREVIEW_CHARS = 160
READ_CHUNK_BYTES = 4 * 2**20
MAX_LINE_BYTES = 32 * 2**20
"""The largest episode line indexed: every answer about one episode is at most this big."""
SEARCH_CHARS = 20_000
"""Characters of an episode's replies the text search looks in (the first ones)."""
CACHE_BYTES = 256 * 2**20
CACHE_FILES = 16
SUMMARY_BYTES = 1_000  # what one episode's summary, span and entries cost, about


def as_int(value: Any, default: int = -1) -> int:
    # Records come from a file a person may have edited: never trust a field's type.
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return default


def as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and value == value and abs(value) != float("inf"):
        return float(value)
    return None


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def loads(line: bytes) -> Any:
    """`parse_line` (ValueError for a torn or unusable line), with NaN and Infinity read as
    None: the page's JSON cannot carry them."""
    return parse_line(line, parse_constant=lambda _: None)


def turns_of(record: dict) -> list[dict]:
    """The record's turns that are objects (anything else in the list is ignored)."""
    turns = record.get("turns")
    return [t for t in turns if isinstance(t, dict)] if isinstance(turns, list) else []


@dataclass(frozen=True)
class EpisodeSummary:
    """What the step view shows and filters on for one episode (one JSONL line)."""

    index: int
    env: str
    group: int
    copy: int
    seed: int
    success: bool
    reward: float | None
    end: str
    turns: int
    actions: int
    format_ok: bool
    problems: tuple[str, ...]
    preview: str

    @classmethod
    def from_record(cls, index: int, record: dict) -> EpisodeSummary:
        turns = turns_of(record)
        problems = sorted({p for t in turns for p in t.get("problems") or () if isinstance(p, str)})
        first_reply = as_str(turns[0].get("reply")) if turns else ""
        return cls(
            index=index,
            env=as_str(record.get("env")),
            group=as_int(record.get("group")),
            copy=as_int(record.get("copy")),
            seed=as_int(record.get("seed")),
            success=record.get("success") is True,
            reward=as_float(record.get("total_reward")),
            end=as_str(record.get("end")),
            turns=len(turns),
            actions=sum(len(t["actions"]) for t in turns if isinstance(t.get("actions"), list)),
            format_ok=bool(turns) and all(t.get("format_ok") is True for t in turns),
            problems=tuple(problems),
            preview=first_reply[:PREVIEW_CHARS],
        )

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "env": self.env,
            "group": self.group,
            "copy": self.copy,
            "seed": self.seed,
            "success": self.success,
            "reward": self.reward,
            "end": self.end,
            "turns": self.turns,
            "actions": self.actions,
            "format_ok": self.format_ok,
            "problems": list(self.problems),
            "preview": self.preview,
        }


def search_text(record: dict) -> str:
    """Lower-cased replies of every turn, the first SEARCH_CHARS characters: what the text
    search looks in."""
    return "\n".join(as_str(t.get("reply")) for t in turns_of(record))[:SEARCH_CHARS].lower()


@dataclass
class FileIndex:
    """Episodes of one JSONL file, refreshed incrementally by :meth:`refresh`. The file is
    read only as a regular file inside ``root`` (see `open_inside`); ``name`` is what the
    page calls it."""

    path: Path
    root: Path
    name: str
    spans: list[tuple[int, int]] = field(default_factory=list)  # byte [start, stop) per episode
    summaries: list[EpisodeSummary] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # search_text per episode
    by_group: dict[int, list[int]] = field(default_factory=dict)
    envs: Counter = field(default_factory=Counter)
    ends: Counter = field(default_factory=Counter)
    skipped: list[int] = field(default_factory=list)  # 1-based line numbers left out
    too_long: list[int] = field(default_factory=list)  # lines over MAX_LINE_BYTES, left out
    refused: str | None = None  # why the file is not read (outside the run, not regular)
    nbytes: int = 0  # memory the summaries and search texts take, about
    torn_tail: bool = False  # the file ends in a line with no "\n" (not indexed)
    lines: int = 0  # complete lines read so far
    end: int = 0  # byte offset just past the last complete line
    stamp: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) when last read

    def __post_init__(self) -> None:
        self.lock = threading.Lock()

    @property
    def exists(self) -> bool:
        return self.stamp is not None

    def refresh(self) -> FileIndex:
        """Bring the index up to date with the file; returns self."""
        with self.lock:
            try:
                fh = open_inside(self.path, self.root, self.name)
            except FileNotFoundError:
                self._reset()
                return self
            except Refused as err:
                self._reset()
                self.refused = str(err)
                return self
            except OSError as err:  # unreadable (permissions), a symlink loop, ...
                self._reset()
                self.refused = f"cannot read {self.name} ({err.strerror or err})"
                return self
            with fh:
                st = os.fstat(fh.fileno())
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
                if stamp == self.stamp:
                    return self
                appended = self.stamp is not None and st.st_ino == self.stamp[0]
                if not appended or st.st_size < self.end:
                    self._reset()
                self._read_from(fh, self.end)
                self.stamp = stamp
        return self

    def record(self, index: int) -> dict:
        """The full record of episode ``index`` (read from disk, not kept in memory).
        ValueError if the file on disk is no longer the one indexed."""
        start, stop = self.spans[index]
        try:
            fh = open_inside(self.path, self.root, self.name)
        except Refused as err:
            raise ValueError(str(err)) from None
        with fh:
            if self.stamp is None or os.fstat(fh.fileno()).st_ino != self.stamp[0]:
                raise ValueError(f"{self.name} was replaced")
            fh.seek(start)
            return loads(fh.read(stop - start))

    def _reset(self) -> None:
        self.spans, self.summaries, self.texts = [], [], []
        self.by_group, self.envs, self.ends = {}, Counter(), Counter()
        self.skipped, self.too_long, self.torn_tail = [], [], False
        self.refused, self.lines, self.end, self.stamp, self.nbytes = None, 0, 0, None, 0

    def _read_from(self, fh: BinaryIO, offset: int) -> None:
        """Index the complete lines from byte ``offset`` on, one chunk at a time. A line
        longer than MAX_LINE_BYTES is dropped while it is read (only its length is kept)."""
        fh.seek(offset)
        pending = bytearray()  # the start of a line not yet ended by "\n"
        start = offset  # file offset of pending[0]
        dropping = False  # the current line passed MAX_LINE_BYTES
        while chunk := fh.read(READ_CHUNK_BYTES):
            pos = 0
            while (newline := chunk.find(b"\n", pos)) != -1:
                self.lines += 1
                if not dropping:
                    pending += chunk[pos:newline]
                if dropping or len(pending) > MAX_LINE_BYTES:
                    self.too_long.append(self.lines)
                else:
                    self._add_line(bytes(pending), start, start + len(pending))
                consumed = offset + newline + 1
                pending, start, dropping = bytearray(), consumed, False
                pos = newline + 1
            if not dropping:
                pending += chunk[pos:]
                if len(pending) > MAX_LINE_BYTES:
                    pending, dropping = bytearray(), True
            offset += len(chunk)
        self.end = start
        self.torn_tail = dropping or bool(pending.strip())

    def _add_line(self, line: bytes, start: int, stop: int) -> None:
        if not line.strip():
            return
        try:
            record = loads(line)
        except ValueError:  # see parse_line
            record = None
        if not isinstance(record, dict):
            self.skipped.append(self.lines)
            return
        summary = EpisodeSummary.from_record(len(self.summaries), record)
        text = search_text(record)
        self.spans.append((start, stop))
        self.summaries.append(summary)
        self.texts.append(text)
        self.nbytes += SUMMARY_BYTES + len(summary.preview) + len(text)
        self.by_group.setdefault(summary.group, []).append(summary.index)
        self.envs[summary.env] += 1
        self.ends[summary.end] += 1


class IndexCache:
    """The most recently used file indexes of run directory ``root`` (a long run has more
    steps than memory wants): at most ``files`` of them, holding at most ``max_bytes``
    together, except that the index just asked for is always kept."""

    def __init__(self, root: Path, files: int = CACHE_FILES, max_bytes: int = CACHE_BYTES) -> None:
        self.root, self.files, self.max_bytes = root, files, max_bytes
        self._items: OrderedDict[Path, FileIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> FileIndex:
        """The up-to-date index of ``path`` (empty, with ``exists`` False, if it is missing)."""
        with self._lock:
            name = str(path.relative_to(self.root))
            index = self._items.pop(path, None) or FileIndex(path, self.root, name)
            self._items[path] = index
        index.refresh()
        with self._lock:
            while len(self._items) > 1 and (
                len(self._items) > self.files
                or sum(i.nbytes for i in self._items.values()) > self.max_bytes
            ):
                oldest = next(iter(self._items))
                if self._items[oldest] is index:  # moved to the end by a later get
                    break
                del self._items[oldest]
        return index

    @property
    def nbytes(self) -> int:
        """Memory the cached indexes take, about."""
        with self._lock:
            return sum(i.nbytes for i in self._items.values())
