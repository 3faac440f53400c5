"""Open a run directory's files for the viewer: regular files inside the run, nothing else.

A check on a path followed by an open of that path can be raced (a step file swapped for a
symlink out of the run between the two), and opening a FIFO blocks forever. So the file is
opened first, without blocking, and the opened descriptor is then checked: it must be a
regular file, and the path the kernel gives for it (``/proc/self/fd`` on Linux,
``F_GETPATH`` on macOS) must lie in the run directory. Whatever was swapped in before the
open, the check sees what was actually opened.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_DELETED = " (deleted)"


class Refused(Exception):
    """A file the viewer will not read; the message, for the page, says why."""


def outside_notice(name: str) -> str:
    return f"{name} links outside the run directory and is not read"


def not_regular_notice(name: str) -> str:
    return f"{name} is not a regular file (a FIFO, device or folder) and is not read"


def open_inside(path: Path, root: Path, name: str) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file in ``root`` (absolute and
    resolved). FileNotFoundError if it is missing (or was deleted while being opened);
    Refused, its message naming the file as ``name``, if it is anything else."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(not_regular_notice(name))
        real = descriptor_path(fd, path)
        if real.endswith(_DELETED) and not os.path.exists(real):
            raise FileNotFoundError(path)
        if not Path(real).is_relative_to(root):
            raise Refused(outside_notice(name))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def descriptor_path(fd: int, path: Path) -> str:
    """The absolute path of the file open as ``fd``, symlinks resolved, as the kernel knows
    it; where the kernel cannot say (neither Linux nor macOS), ``path`` resolved now."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    try:
        import fcntl

        get_path = getattr(fcntl, "F_GETPATH", None)
        if get_path is not None:
            raw = fcntl.fcntl(fd, get_path, bytes(1024))
            return os.fsdecode(raw.split(b"\0", 1)[0])
    except OSError:
        pass
    return os.path.realpath(path)


def read_inside(path: Path, root: Path, name: str, limit: int) -> bytes:
    """The whole content of a regular file in ``root`` (see `open_inside`); Refused if it
    holds more than ``limit`` bytes."""
    with open_inside(path, root, name) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"{name} is larger than {size_text(limit)} and is not read")
    return data


def size_text(nbytes: int) -> str:
    """A byte count for a person: ``64 MB``, ``146 KB``."""
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.0f} MB"
    return f"{nbytes / 2**10:.0f} KB"
