"""Decode batches and kept caches are planned from the whole memory, so a machine sizes them
alike on every run whatever happens to be free, and shrink (with a warning) only when too
little is free."""

import warnings

import pytest
import torch

from ragen.rollout.engines import Request, make_generator
from ragen.rollout.engines.memory import (
    _MAX_AUTO_BATCH_CPU,
    MEMORY_SHORT,
    Fit,
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
    assert sizes == [Fit(72, cut=False)] * 3  # 0.3 * 24 GiB = 7.2 GiB, in items of 0.1 GiB


def test_short_free_memory_cuts_the_plan_and_warns(memory):
    memory(24, 5)  # other processes hold 19 GiB: 0.6 * 5 GiB = 3 GiB may be taken
    with pytest.warns(UserWarning, match="free memory is short") as caught:
        assert memory_fit(CPU, 0.3, GIB // 10, 10**6) == Fit(30, cut=True)
    assert str(caught[0].message) == MEMORY_SHORT


def test_the_plan_holds_no_more_than_wanted_and_at_least_one(memory):
    memory(24, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 7 items fit easily: nothing is cut
        assert memory_fit(CPU, 0.3, GIB // 10, 7) == Fit(7, cut=False)
    memory(24, 23)
    assert memory_fit(CPU, 0.3, 100 * GIB, 7) == Fit(1, cut=False)  # one at a time, as planned


def test_the_decode_batch_is_capped_on_a_cpu(memory, tiny):
    model, _ = tiny
    memory(24, 23)
    assert auto_max_batch(model, 100, 1000) == Fit(_MAX_AUTO_BATCH_CPU, cut=False)
    assert _kv_bytes_per_token(model) == 512  # 2 layers, keys and values, fp32
    # Rows of 10^6 tokens hold 3 * 512 B * 10^6 = 1.536e9 B; 0.2 * 24 GiB = 5.15e9 B takes 3.
    assert auto_max_batch(model, 10**6, 1000) == Fit(3, cut=False)


def test_a_cut_counts_only_where_it_changes_how_the_rows_are_grouped(memory, tiny):
    model, _ = tiny
    # Rows of 10^6 tokens (1.536e9 B each): the whole memory's share takes 3, and 0.6 of
    # 5.2e9 B free, 3.12e9 B, takes 2.
    memory(24, 5.2e9 / GIB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # two rows at hand decode together either way
        assert auto_max_batch(model, 10**6, 2) == Fit(2, cut=False)
    with pytest.warns(UserWarning, match="free memory is short"):
        assert auto_max_batch(model, 10**6, 5) == Fit(2, cut=True)  # 2 + 2 + 1, not 3 + 2


@pytest.mark.parametrize("backend", ["hf", "naive"])
def test_a_generator_counts_the_batches_free_memory_cut(memory, tiny, backend):
    model, tokenizer = tiny
    generator = make_generator(backend, model, tokenizer)
    requests = [Request(key=i, context_ids=tokenizer.encode(f"row {i}")) for i in range(4)]
    memory(24, 23)
    generator.generate(requests, max_new_tokens=4, temperature=1.0, seed=0)
    assert generator.stats.memory_cuts == 0
    memory(24, 1e-6)  # about 1 kB free: one row at a time
    with pytest.warns(UserWarning, match="free memory is short"):
        generator.generate(requests, max_new_tokens=4, temperature=1.0, seed=0)
        generator.generate(requests[:1], max_new_tokens=4, temperature=1.0, seed=0)
    assert generator.stats.memory_cuts == 1  # the single row was never grouped
