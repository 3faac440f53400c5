"""Host memory: how much there is, how much a new allocation can still get, and giving freed
heap back.

Both figures stop at the memory limit of the process's cgroup where one is set (a container
run with ``--memory``, a batch job's slot): ``/proc/meminfo`` describes the whole machine,
while the kernel kills a process whose cgroup passes its limit.

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
CGROUPS = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit count; anything this large
# is no limit.
_NO_LIMIT = 2**62


def total_memory(
    meminfo: Path = MEMINFO, cgroups: Path = CGROUPS, self_cgroup: Path = SELF_CGROUP
) -> int:
    """Bytes of physical memory: ``MemTotal`` on Linux, else the physical pages, else 16 GiB
    when the system cannot be asked; at most the memory limit of the process's cgroup (a
    container's ``--memory``), which the kernel enforces whatever the machine has."""
    found = _meminfo_bytes("MemTotal", meminfo)
    total = found if found is not None else _pages("SC_PHYS_PAGES", 16 * 2**30)
    limits = cgroup_memory(cgroups, self_cgroup)
    return total if limits is None else min(total, limits[0])


def available_memory(
    meminfo: Path = MEMINFO, cgroups: Path = CGROUPS, self_cgroup: Path = SELF_CGROUP
) -> int:
    """Bytes a new allocation can get without swapping: ``MemAvailable`` on Linux, else the
    free physical pages, else a modest 8 GiB when the system cannot be asked; at most what
    the process's cgroup has left under its memory limit."""
    found = _meminfo_bytes("MemAvailable", meminfo)
    available = found if found is not None else _pages("SC_AVPHYS_PAGES", 8 * 2**30)
    limits = cgroup_memory(cgroups, self_cgroup)
    return available if limits is None else min(available, limits[1])


def cgroup_memory(
    cgroups: Path = CGROUPS, self_cgroup: Path = SELF_CGROUP
) -> tuple[int, int] | None:
    """(the tightest memory limit, the fewest bytes left under one) over the process's cgroup
    and its parents (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), where one is set and
    readable; None otherwise. What is left counts the cgroup's inactive file pages as free,
    as the kernel reclaims them before it kills. A cgroup named in ``self_cgroup`` but not
    found under ``cgroups`` (a container sees its own as the root) is read at the root."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            found += _limits(cgroups, path, "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            found += _limits(
                cgroups / "memory",
                path,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )
    if not found:
        return None
    return min(bound for bound, _ in found), min(left for _, left in found)


def _limits(root: Path, path: str, limit: str, usage: str, inactive: str) -> list[tuple[int, int]]:
    """(limit, left) of each limited cgroup from ``path`` up to ``root``."""
    leaf = root / path.strip("/")
    if not leaf.is_dir():
        leaf = root
    folders = [leaf, *leaf.parents]
    found = []
    for folder in folders[: folders.index(root) + 1]:
        bound, used = _read_int(folder / limit), _read_int(folder / usage)
        if bound is None or bound >= _NO_LIMIT or used is None:
            continue
        reclaimable = _stat_field(folder / "memory.stat", inactive) or 0
        found.append((bound, max(bound - used + reclaimable, 0)))
    return found


def _read_int(path: Path) -> int | None:
    """The integer a cgroup file holds; None where it is missing, unreadable or not one
    (v2 writes "max" for no limit)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _stat_field(path: Path, field: str) -> int | None:
    """One field of a cgroup's ``memory.stat``; None where it cannot be read."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == field:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


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
