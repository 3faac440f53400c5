"""torch's thread count: the cores free at the start, OMP_NUM_THREADS, or trainer.threads."""

import os

import pytest
import torch

from ragen import threads


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
