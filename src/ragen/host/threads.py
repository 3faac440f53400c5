"""How many threads torch computes with: by default, the cores that are free when a run starts.

torch takes every core by default. Where another process keeps a core busy, a torch thread
that shares that core holds up every op, since each op waits for its slowest thread; one
thread fewer is then faster. ``trainer.threads=0`` (auto) samples ``/proc/stat`` for a moment,
counts the cores another process keeps busy (sampling again, up to ``SAMPLES`` times, while a
core looks busy: see there), and takes the rest of the cores this process may run on, at
least one. ``OMP_NUM_THREADS``, when set, is the user's own choice and wins (torchrun sets it
to 1 when it starts several processes on a machine). Between training steps the count
follows the machine (``Follower``): what other processes ran during the last step, this
process's own CPU time taken out of the machine's, decides the next step's threads, so a run
started beside a job takes the core back when the job ends, and gives it up when one starts.
Where a machine's kernels give other rounding at another thread count, a run's numbers then
depend on the load it met; ``trainer.threads=N`` pins the count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

SAMPLE_S = 0.3
"""How long the idle sample lasts: long enough to see a busy core, short beside a model load."""
SAMPLES = 10
"""Samples at most while a core looks busy, the fewest busy cores seen counting: a run that
has just ended keeps a core busy for a moment while its memory is freed, while a job that
holds a core holds it in every sample. A quiet machine takes one sample."""


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores since boot, from /proc/stat; None off Linux."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def busy_cores(
    before: tuple[int, int], after: tuple[int, int], cores: int, own_jiffies: float = 0.0
) -> float:
    """Cores busy on average between two ``cpu_times`` samples of a machine of ``cores``,
    less ``own_jiffies``, the CPU time this process ran meanwhile (all its threads): with it,
    the cores other processes kept busy."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return cores * max(0.0, busy - own_jiffies) / total if total > 0 else 0.0


def free_threads(busy: float, cores: int, allowed: int) -> int:
    """Threads to use when ``busy`` of the machine's ``cores`` are taken and this process may
    run on ``allowed`` of them: a core counts as taken when it is busy half the time or more."""
    return max(1, min(allowed, cores - round(busy)))


def _omp_threads() -> int:
    """OMP_NUM_THREADS when it is set to a positive count, else 0."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() else 0


def _allowed(cores: int) -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores


def choose(setting: int) -> tuple[int, str]:
    """(threads, why) for ``trainer.threads`` = ``setting`` (0: auto)."""
    if setting > 0:
        return setting, "trainer.threads"
    if _omp_threads():
        return _omp_threads(), "OMP_NUM_THREADS"
    cores = os.cpu_count() or 1
    allowed = _allowed(cores)
    before = cpu_times()
    if before is None:
        return allowed, f"{allowed} cores"
    busy = float(cores)
    for _ in range(SAMPLES):
        time.sleep(SAMPLE_S)
        after = cpu_times()
        assert after is not None  # it read a moment ago
        busy = min(busy, busy_cores(before, after, cores))
        if free_threads(busy, cores, allowed) == allowed:
            break
        before = after
    threads = free_threads(busy, cores, allowed)
    why = f"{busy:.1f} of {cores} cores busy at the start; trainer.threads=N sets it"
    return threads, why


FOLLOW_MIN_S = 5.0
"""The shortest window the follower judges: a shorter one (a tiny model's step) is too few
jiffies to tell a busy core from noise, so it waits for more."""


class Follower:
    """With ``trainer.threads=0`` and no OMP_NUM_THREADS, sets torch's thread count before
    each step to the cores that other processes left free since the last call. Used as a
    context, it gives torch back the count it found when the context ends.

    ``whole_run`` is False when the run also computes in processes of its own (a vLLM
    engine): their CPU time would read as another job's, so the count stays."""

    def __init__(self, setting: int, say=print, *, whole_run: bool = True):
        self.say = say
        self.found = torch.get_num_threads()
        self.cores = os.cpu_count() or 1
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        first = cpu_times()
        self.active = setting == 0 and whole_run and not _omp_threads() and first is not None
        self.mark = (first, time.process_time(), time.monotonic())

    def __call__(self) -> int:
        """The thread count for the next step (changed and said when the machine changed)."""
        threads = torch.get_num_threads()
        times, own, started = self.mark
        if not self.active or time.monotonic() - started < FOLLOW_MIN_S:
            return threads
        now = cpu_times()
        assert now is not None and times is not None  # active: /proc/stat was read
        self.mark = (now, time.process_time(), time.monotonic())
        own_jiffies = (self.mark[1] - own) * self.tick
        elsewhere = busy_cores(times, now, self.cores, own_jiffies)
        wanted = free_threads(elsewhere, self.cores, _allowed(self.cores))
        if wanted != threads:
            self.say(
                f"torch threads: {threads} -> {wanted} ({elsewhere:.1f} of {self.cores} cores "
                "busy elsewhere since the last step; trainer.threads=N sets it)"
            )
            torch.set_num_threads(wanted)
        return wanted

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.found)


@contextmanager
def computing_with(setting: int, say=print) -> Iterator[int]:
    """Run the body with torch's thread count chosen for ``setting`` (see ``choose``), saying
    so when it is fewer than the cores; the count before is restored after."""
    previous = torch.get_num_threads()
    threads, why = choose(setting)
    if threads < (os.cpu_count() or 1):
        say(f"torch threads: {threads} ({why})")
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(previous)
