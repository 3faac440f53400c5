"""torch's thread count: the cores free at the start, OMP_NUM_THREADS, or trainer.threads."""

import os

import pytest
import torch

from ragen.host import threads


def test_busy_cores_are_the_busy_share_of_the_elapsed_jiffies():
    # 200 jiffies elapsed over the whole machine, 100 of them busy: one of two cores
    assert threads.busy_cores((1000, 5000), (1100, 5200), cores=2) == 1.0
    assert threads.busy_cores((1000, 5000), (1030, 5200), cores=2) == pytest.approx(0.3)
    assert threads.busy_cores((1000, 5000), (1000, 5000), cores=2) == 0.0  # no time passed


@pytest.mark.parametrize(
    ("busy", "cores", "allowed", "want"),
    [
        (0.1, 2, 2, 2),  # a quiet machine: every core
        (0.6, 2, 2, 1),  # a core busy more than half the time is taken
        (0.4, 2, 2, 2),
        (1.9, 2, 2, 1),  # both busy: still one thread
        (1.0, 8, 4, 4),  # affinity allows 4 of the 7 free cores
    ],
)
def test_free_threads_leave_the_busy_cores_to_whoever_holds_them(busy, cores, allowed, want):
    assert threads.free_threads(busy, cores, allowed) == want


def test_an_explicit_setting_then_omp_num_threads_win_over_the_sample(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.choose(5) == (5, "trainer.threads")
    assert threads.choose(0) == (3, "OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    # one real sample of this machine (a busy one, beside the other tests, would be sampled
    # again up to SAMPLES times; the resampling is proven on a made-up machine below)
    monkeypatch.setattr(threads, "SAMPLES", 1)
    count, why = threads.choose(0)
    assert 1 <= count <= (os.cpu_count() or 1) and "cores busy" in why


def test_the_thread_count_is_restored_after_the_run():
    before = torch.get_num_threads()
    said = []
    with threads.computing_with(1, say=said.append) as count:
        assert count == torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    if (os.cpu_count() or 1) > 1:
        assert said == ["torch threads: 1 (trainer.threads)"]


def _machine(monkeypatch, busy_per_sample, cores=2):
    """/proc/stat of a machine of ``cores`` on which ``busy_per_sample[i]`` cores are busy
    during sample i (each 100 jiffies a core); returns the list of reads made."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    readings = [(0, 0)]
    for busy in busy_per_sample:
        readings.append((readings[-1][0] + round(100 * busy), readings[-1][1] + 100 * cores))
    reads = []

    def cpu_times():
        reads.append(readings[min(len(reads), len(readings) - 1)])
        return reads[-1]

    monkeypatch.setattr(threads, "cpu_times", cpu_times)
    return reads


def test_a_core_busy_for_a_moment_is_sampled_again_and_given_back(monkeypatch):
    reads = _machine(monkeypatch, [1.0, 1.0, 0.1])  # a run that just ended, freeing memory
    count, why = threads.choose(0)
    assert count == 2 and len(reads) == 1 + 3 and why.startswith("0.1 of 2 cores busy")


def test_a_core_busy_in_every_sample_is_left_to_its_job(monkeypatch):
    reads = _machine(monkeypatch, [1.0] * threads.SAMPLES)
    assert threads.choose(0)[0] == 1 and len(reads) == 1 + threads.SAMPLES
    quiet = _machine(monkeypatch, [0.0])
    assert threads.choose(0)[0] == 2 and len(quiet) == 1 + 1  # a quiet machine: one sample


def test_busy_cores_elsewhere_take_this_process_own_time_out():
    # 400 jiffies over 2 cores, 300 busy, 200 of them this process's: half a core elsewhere
    assert threads.busy_cores((0, 0), (300, 400), 2, own_jiffies=200.0) == 0.5
    assert threads.busy_cores((0, 0), (400, 400), 2, own_jiffies=400.0) == 0.0  # all ours
    # the process's clock and /proc/stat tick apart: never below zero
    assert threads.busy_cores((0, 0), (100, 400), 2, own_jiffies=120.0) == 0.0


class _Clock:
    """A 2-core machine whose steps last 10 s (1,000 jiffies a core at 100 Hz): each
    ``step(ours, others)`` adds the cores this process and other processes kept busy."""

    def __init__(self, monkeypatch):
        self.jiffies, self.busy, self.own_s, self.now = 0, 0, 0.0, 0.0
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
        monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
        monkeypatch.setattr(threads.os, "sysconf", lambda name: 100)
        monkeypatch.setattr(threads, "cpu_times", lambda: (self.busy, self.jiffies))
        monkeypatch.setattr(threads.time, "process_time", lambda: self.own_s)
        monkeypatch.setattr(threads.time, "monotonic", lambda: self.now)

    def step(self, ours: float, others: float, seconds: float = 10.0) -> None:
        self.now += seconds
        self.own_s += ours * seconds
        self.jiffies += round(2 * 100 * seconds)
        self.busy += round((ours + others) * 100 * seconds)


@pytest.mark.usefixtures("keep_threads")
def test_the_follower_gives_a_core_up_to_a_new_job_and_takes_it_back(monkeypatch):
    clock, said = _Clock(monkeypatch), []
    torch.set_num_threads(2)
    follow = threads.Follower(0, say=said.append)
    clock.step(ours=2.0, others=0.0)  # the machine to itself: both cores ours
    assert follow() == 2 and said == []
    clock.step(ours=1.0, others=1.0)  # a job started on the other core
    assert follow() == 1 == torch.get_num_threads()
    assert said == [
        "torch threads: 2 -> 1 (1.0 of 2 cores busy elsewhere since the last step; "
        "trainer.threads=N sets it)"
    ]
    clock.step(ours=1.0, others=1.0)  # it still runs: one thread stays
    assert follow() == 1 and len(said) == 1
    clock.step(ours=1.0, others=0.2)  # it ended early in the step
    assert follow() == 2 == torch.get_num_threads() and said[-1].startswith("torch threads: 1 -> 2")


@pytest.mark.usefixtures("keep_threads")
def test_the_follower_gives_back_the_count_it_found(monkeypatch):
    clock = _Clock(monkeypatch)
    torch.set_num_threads(2)
    with threads.Follower(0, say=lambda line: None) as follow:
        clock.step(ours=1.0, others=1.0)
        assert follow() == 1
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("keep_threads")
def test_the_follower_waits_for_a_window_long_enough_to_judge(monkeypatch):
    clock = _Clock(monkeypatch)
    torch.set_num_threads(2)
    follow = threads.Follower(0, say=lambda line: None)
    for _ in range(4):  # four 1-second steps beside a busy core: too short, then judged
        clock.step(ours=1.0, others=1.0, seconds=1.0)
        assert follow() == 2
    clock.step(ours=1.0, others=1.0, seconds=1.0)  # 5 s since the start: the whole window
    assert follow() == 1


@pytest.mark.usefixtures("keep_threads")
def test_a_set_thread_count_or_a_run_with_an_engine_is_never_followed(monkeypatch):
    clock, said = _Clock(monkeypatch), []
    torch.set_num_threads(2)
    pinned = threads.Follower(2, say=said.append)
    clock.step(ours=1.0, others=1.0)
    assert pinned() == 2 and said == []
    engine = threads.Follower(0, say=said.append, whole_run=False)  # a vLLM engine's run
    clock.step(ours=1.0, others=1.0)
    assert engine() == 2 and said == []
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    from_env = threads.Follower(0, say=said.append)
    clock.step(ours=1.0, others=1.0)
    assert from_env() == 2 and said == []
