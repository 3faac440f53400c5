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
