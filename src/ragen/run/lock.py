"""One writer per run directory: an advisory lock on ``RUN_DIR/.lock``.

``fcntl.flock`` locks belong to the open file, so the kernel drops the lock when its holder
exits, however it exits: a lock left by a killed run is free, and the next writer takes it
over. The file itself stays (removing it would race with a process that has just opened it);
it holds the current holder's pid and host, which a refused writer names. The one exception:
a lock file whose record cannot be written (a full disk) is removed by the process that
created it, while it still holds it, so a failed start leaves no empty lock behind.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime

from ragen.run.jsonl import RunDirError, write_all
from ragen.run.rundir import RunDir


@contextmanager
def hold(run: RunDir) -> Iterator[None]:
    """Hold ``run``'s writer lock while the block runs (creating the folder if need be);
    raise RunDirError naming the holder if another live process holds it, or saying what
    to do if the lock cannot be written, leaving no lock file (nor the folder, if it made
    it)."""
    made = not run.root.exists()
    try:
        with run.writing(run.lock, then="run again"):
            run.root.mkdir(parents=True, exist_ok=True)
            fh = _take(run)
    except RunDirError:
        if made:
            with suppress(OSError):  # only if empty: another writer may have filled it
                run.root.rmdir()
        raise
    try:
        yield
    finally:
        fh.close()  # releases the lock


def _take(run: RunDir) -> io.FileIO:
    """The run's lock file, opened (created if need be), locked and holding this process's
    record; RunDirError naming the holder if a live process holds it."""
    try:
        fh, created = open(run.lock, "xb+", buffering=0), True  # noqa: SIM115 (kept open)
    except FileExistsError:
        fh, created = open(run.lock, "rb+", buffering=0), False  # noqa: SIM115 (kept open)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = _holder(fh)
        fh.close()
        raise RunDirError(
            f"{run.root} is in use by {who}: one process writes a run at a time; "
            "wait for it to end or stop it, then run again"
        ) from None
    try:
        _record_holder(fh)
    except BaseException:
        if created:  # ours, and still locked by us: no other writer has it
            run.lock.unlink(missing_ok=True)
        fh.close()
        raise
    return fh


def holder(run: RunDir) -> str | None:
    """Who holds ``run``'s writer lock now (pid, host, since), or None if no live process
    does; reads only: a folder or lock file that is not there stays so."""
    try:
        fh = open(run.lock, encoding="utf-8")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        return None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(fh)
        return None  # closing the file releases the shared lock just taken


def _record_holder(fh: io.FileIO) -> None:
    """Write this process's pid, host and start time over the old record, then cut the file
    to its length (never emptied first)."""
    since = datetime.now(UTC).isoformat(timespec="seconds")
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since})
    fh.seek(0)
    write_all(fh, record.encode("utf-8"))
    fh.truncate()


def _holder(fh) -> str:
    """Who holds the lock, as the holder wrote it (it may be writing it this instant)."""
    fh.seek(0)
    try:
        holder = json.loads(fh.read())
        return f"pid {holder['pid']} on host {holder['host']} (since {holder['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
