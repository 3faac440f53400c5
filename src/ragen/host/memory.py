"""Host memory: how much there is, how much a new allocation can still get, and giving freed
heap back.

The generator plans its decode batch and the caches it keeps between turns from the whole
memory (``total_memory``), so one machine sizes them alike on every run, and cuts them to
what is free where too little is (see ``rollout.engines.memory.memory_fit``); on a CPU a
bigger batch decodes faster. Two things hide free memory that is really there:

- the page cache: ``MemFree`` leaves out file pages the kernel drops on demand (gigabytes
  after a run has read a model and written trajectories); ``MemAvailable`` counts them;
- glibc's heap: freed activations and KV caches stay in the process (the heap shrinks only
  from its top), so after a training step most of the process's memory can be free heap
  that no other allocation sees. ``trim_heap`` (glibc's ``malloc_trim``) returns it; the
  trainer and the evaluator call it after each update and evaluation, so the next decode
  batch is sized from the memory that is really there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache
from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def total_memory(meminfo: Path = MEMINFO) -> int:
    """Bytes of physical memory: ``MemTotal`` on Linux, else the physical pages, else 16 GiB
    when the system cannot be asked."""
    found = _meminfo_bytes("MemTotal", meminfo)
    return found if found is not None else _pages("SC_PHYS_PAGES", 16 * 2**30)


def available_memory(meminfo: Path = MEMINFO) -> int:
    """Bytes a new allocation can get without swapping: ``MemAvailable`` on Linux, else the
    free physical pages, else a modest 8 GiB when the system cannot be asked."""
    found = _meminfo_bytes("MemAvailable", meminfo)
    return found if found is not None else _pages("SC_AVPHYS_PAGES", 8 * 2**30)


def _meminfo_bytes(field: str, meminfo: Path) -> int | None:
    """One field of ``/proc/meminfo`` in bytes, or None where it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _pages(name: str, fallback: int) -> int:
    """``os.sysconf(name)`` pages in bytes, or ``fallback`` where the system cannot say."""
    try:
        return os.sysconf(name) * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return fallback


@cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the heap's free pages to the system (glibc); True when some were returned."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def peak_rss(status: Path = STATUS) -> int | None:
    """Bytes of this process's peak resident memory (Linux's ``VmHWM``: everything it held
    at once, the models included) since it started or since ``reset_peak_rss``; None where
    Linux's /proc cannot say."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss(clear_refs: Path = CLEAR_REFS) -> bool:
    """Start ``peak_rss`` over from the memory held now (``5`` to ``clear_refs``, Linux 4.0
    on, which changes nothing else); False where it cannot."""
    try:
        clear_refs.write_text("5")
    except OSError:
        return False
    return True
