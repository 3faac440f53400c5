"""Append-only JSONL files and whole-file atomic writes, safe against a killed writer.

Every append is a whole line, flushed and fsynced before the call returns, so a run killed at
any moment keeps every completed record, and an append that fails (a full disk) leaves the
file as it was; a reader skips the torn last line of a killed run, and lines that cannot be
shown (a lone surrogate, a number past a float's range) are skipped and counted.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message says what to do."""


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
    """Append records as lines, then fsync; returns how many were written. The append is
    whole or nothing: a failed write (a full disk, a file size limit) cuts the file back to
    what it was, or removes the file it created, before raising."""
    lines = [to_json_line(r) + "\n" for r in records]
    data = "".join(lines).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with open(path, "a+b", buffering=0) as fh:
        size = fh.seek(0, os.SEEK_END)
        # A run killed mid-write leaves a last line without "\n"; start ours on a fresh line
        # so the torn line stays alone (and skipped) instead of swallowing the next record.
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                data = b"\n" + data
        try:
            write_all(fh, data)
            os.fsync(fh.fileno())
        except BaseException:
            fh.truncate(size)
            if new:
                path.unlink(missing_ok=True)
            raise
    return len(lines)


def write_all(fh: io.FileIO, data: bytes) -> None:
    """Write all of ``data`` to an unbuffered file: a short write (at a file size limit) is
    continued, and the write of its rest raises the reason (EFBIG, ENOSPC). Unbuffered, a
    failed write leaves nothing pending that closing the file would try again."""
    left = memoryview(data)
    while left:
        left = left[fh.write(left) :]


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
    path = Path(path)
    if not path.exists():
        return JsonlRead([], [])
    try:
        with open(path, "rb") as fh:
            return parse_jsonl(fh)
    except OSError as err:
        raise RunDirError(
            f"cannot read {path} ({err.strerror or err}): it must be a readable JSONL file"
        ) from err


def parse_jsonl(lines: Iterable[bytes]) -> JsonlRead:
    """The well-formed object lines of ``lines`` (an open binary file, or its lines); the
    1-based numbers of the others (see `parse_line`) in ``skipped``."""
    records: list[dict] = []
    skipped: list[int] = []
    for number, line in enumerate(lines, start=1):
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
    return JsonlRead(records, skipped)
