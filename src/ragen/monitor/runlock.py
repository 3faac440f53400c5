"""One writer per run directory: an advisory lock on ``RUN_DIR/.lock``.

``fcntl.flock`` locks belong to the open file, so the kernel drops the lock when its holder
exits, however it exits: a lock left by a killed run is free, and the next writer takes it
over. The file itself stays (removing it would race with a process that has just opened it);
it holds the current holder's pid and host, which a refused writer names.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from ragen.monitor.jsonl import RunDirError
from ragen.monitor.rundir import RunDir


@contextmanager
def hold(run: RunDir) -> Iterator[None]:
    """Hold ``run``'s writer lock while the block runs (creating the folder if need be);
    raise RunDirError naming the holder if another live process holds it."""
    with run.writing(run.lock, then="run again"):
        run.root.mkdir(parents=True, exist_ok=True)
        fh = open(run.lock, "a+", encoding="utf-8")  # noqa: SIM115 (kept open while held)
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirError(
                f"{run.root} is in use by {_holder(fh)}: one process writes a run at a time; "
                "wait for it to end or stop it, then run again"
            ) from None
        with run.writing(run.lock, then="run again"):
            _record_holder(fh)
        yield
    finally:
        fh.close()  # releases the lock


def _record_holder(fh) -> None:
    fh.seek(0)
    fh.truncate()
    since = datetime.now(UTC).isoformat(timespec="seconds")
    fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}))
    fh.flush()


def _holder(fh) -> str:
    """Who holds the lock, as the holder wrote it (it may be writing it this instant)."""
    fh.seek(0)
    try:
        holder = json.loads(fh.read())
        return f"pid {holder['pid']} on host {holder['host']} (since {holder['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process"
