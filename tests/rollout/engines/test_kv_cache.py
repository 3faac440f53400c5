"""KV caches in preallocated buffers: reading a row back, and finished rows leaving a batch."""

from __future__ import annotations

import torch

from ragen.rollout.engines.kv_cache import Batch, drop_rows, padded_cache, row_kv, spans


def test_spans_of_a_column_mask():
    mask = torch.tensor([0, 1, 1, 0, 0, 1, 0], dtype=torch.bool)
    assert spans(mask) == [(1, 3), (5, 6)]
    assert spans(torch.ones(3, dtype=torch.bool)) == [(0, 3)]
    assert spans(torch.zeros(2, dtype=torch.bool)) == []


def test_finished_rows_leave_the_batch_and_live_rows_keep_their_caches():
    rows, width = 5, 7
    sources = [torch.randn(2, 2, 1, 3 + b, 4) for b in range(rows)]  # (layers, 2, H, L, D)
    lengths = torch.tensor([3 + b for b in range(rows)])
    mask = torch.arange(width)[None, :] >= (width - lengths)[:, None]  # (B, K)
    cache = padded_cache(sources, width, width + 2)
    batch = Batch(list(range(10, 15)), cache, mask, None, lengths.clone(), torch.zeros(rows, 3))
    tokens = drop_rows(batch, [1, 4], torch.arange(rows))
    # Rows 1 and 4 finished: row 3, the last live one, moves into row 1's place.
    assert batch.index == [10, 13, 12]
    assert tokens.tolist() == [0, 3, 2]
    assert batch.positions.tolist() == [3, 6, 5]
    assert [layer.keys.shape[0] for layer in batch.cache.layers] == [3, 3]
    for new, old in enumerate([0, 3, 2]):
        assert torch.equal(row_kv(batch.cache, new, batch.mask[new]), sources[old])
