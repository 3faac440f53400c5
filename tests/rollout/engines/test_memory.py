"""Decode batches and kept caches are planned from the whole memory, so a machine sizes them
alike on every run whatever happens to be free, and shrink (with a warning) only when too
little is free."""

import warnings

import pytest
import torch

from ragen.rollout.engines.memory import (
    _MAX_AUTO_BATCH_CPU,
    MEMORY_SHORT,
    _kv_bytes_per_token,
    auto_max_batch,
    memory_fit,
)

MODULE = "ragen.rollout.engines.memory"
GIB = 2**30
CPU = torch.device("cpu")


@pytest.fixture
def memory(monkeypatch):
    """Set the machine's whole and free memory, in GiB."""

    def set_memory(total: float, free: float) -> None:
        monkeypatch.setattr("ragen.rollout.engines.memory.total_memory", lambda: int(total * GIB))
        monkeypatch.setattr(
            "ragen.rollout.engines.memory.available_memory", lambda: int(free * GIB)
        )

    return set_memory


def test_the_plan_is_a_share_of_the_whole_memory_whatever_is_free(memory):
    sizes = []
    for free in (23.4, 23.3, 18.0):  # the same machine at three moments of a run
        memory(24, free)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # ample free memory: no warning
            sizes.append(memory_fit(CPU, 0.3, GIB // 10, 10**6))
    assert sizes == [72, 72, 72]  # 0.3 * 24 GiB = 7.2 GiB, in items of 0.1 GiB


def test_short_free_memory_cuts_the_plan_and_warns(memory):
    memory(24, 5)  # other processes hold 19 GiB: 0.6 * 5 GiB = 3 GiB may be taken
    with pytest.warns(UserWarning, match="free memory is short") as caught:
        assert memory_fit(CPU, 0.3, GIB // 10, 10**6) == 30
    assert str(caught[0].message) == MEMORY_SHORT


def test_the_plan_holds_no_more_than_wanted_and_at_least_one(memory):
    memory(24, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 7 items fit easily: nothing is cut
        assert memory_fit(CPU, 0.3, GIB // 10, 7) == 7
    memory(24, 23)
    assert memory_fit(CPU, 0.3, 100 * GIB, 7) == 1  # nothing fits: one at a time


def test_the_decode_batch_is_capped_on_a_cpu(memory, tiny):
    model, _ = tiny
    memory(24, 23)
    assert auto_max_batch(model, 100) == _MAX_AUTO_BATCH_CPU
    assert _kv_bytes_per_token(model) == 512  # 2 layers, keys and values, fp32
    # Rows of 10^6 tokens hold 3 * 512 B * 10^6 = 1.536e9 B; 0.2 * 24 GiB = 5.15e9 B takes 3.
    assert auto_max_batch(model, 10**6) == 3
