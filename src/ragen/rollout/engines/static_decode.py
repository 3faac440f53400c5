"""Decode steps of fixed shapes, replayed from a captured CUDA graph on a GPU.

On a GPU a decode forward of a small model is a few milliseconds of kernels behind many more
of Python and kernel launches (docs/performance.md measures both). A graph replays the same
kernels on the same addresses, so :class:`StaticDecoder` keeps every shape and address fixed
for the life of a decode batch:

- the batch stays whole until its last row stops (finished rows decode on, unread);
- each step's keys/values go to the cache column held in a device tensor, not a Python int;
- the attention mask is a (B, 1, 1, capacity) tensor updated in place, whose columns not yet
  written are masked out, so every step attends over the whole capacity.

Without ``capture`` (a CPU) the same step runs eagerly: slower than the shrinking batch of
the cached engine's own path, and there only so that tests can hold the two paths to the same
tokens.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ragen.models.kv_keyword import cache_keyword

# Eager forwards before capture: they settle lazy initialisation (cuBLAS handles, kernel
# choices, the allocator's pools) that must not happen inside the capture.
_WARMUP_STEPS = 2


class _ColumnLayer(DynamicLayer):
    """One layer's keys/values in a fixed buffer; each update writes at ``column``."""

    def __init__(self, kv: torch.Tensor, column: torch.Tensor):
        # kv: (2, B, H_kv, capacity, D); column: (1,) long on kv's device.
        super().__init__()
        self.dtype, self.device, self.is_initialized = kv.dtype, kv.device, True
        self.column, self.capacity = column, kv.shape[3]
        self.keys, self.values = kv[0], kv[1]  # (B, H_kv, capacity, D) views

    def update(self, key_states, value_states, *args, **kwargs):
        # key_states, value_states: (B, H_kv, 1, D)
        self.keys.index_copy_(2, self.column, key_states)
        self.values.index_copy_(2, self.column, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.capacity


class _ColumnCache(Cache):
    """A transformers Cache of :class:`_ColumnLayer` s."""

    def __init__(self, layers: list[_ColumnLayer]):
        super().__init__(layers=list(layers))


class StaticDecoder:
    """Decode forwards of one batch over buffers filled up to column ``width``.

    buffers: per layer (2, B, H_kv, capacity, D), the keys/values of the prefilled contexts,
    right-aligned in columns [0, width) (the layout of ``kv_cache.padded_cache``); they are
    written in place. mask: (B, width) bool, which of those columns hold a real token.
    positions: (B,) long, the position of each row's next token.
    """

    def __init__(self, model, buffers, mask, positions, width: int, *, capture: bool):
        device = buffers[0].device
        rows, capacity = buffers[0].shape[1], buffers[0].shape[3]
        self.model, self.keyword = model, cache_keyword(model)
        self.column = torch.tensor([width], device=device)  # (1,): where the next token goes
        self.mask = torch.zeros(rows, 1, 1, capacity, dtype=torch.bool, device=device)
        self.mask[:, 0, 0, :width] = mask.to(device)
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = positions[:, None].to(device)  # (B, 1), a copy
        for kv in buffers:
            # Every step attends over the whole capacity; a masked column still enters the
            # product (weight 0 × value), so it must hold zeros, never leftover NaN bits.
            kv[:, :, :, width:] = 0
        self.cache = _ColumnCache([_ColumnLayer(kv, self.column) for kv in buffers])
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # (B, V): the captured step's output
        if capture:
            self._capture()

    def _forward(self) -> torch.Tensor:
        self.mask.index_fill_(3, self.column, True)  # the fed token attends to itself too
        out = self.model(
            input_ids=self.tokens,
            attention_mask=self.mask,
            position_ids=self.positions,
            **{self.keyword: self.cache},
            use_cache=True,
        )
        return out.logits[:, -1]  # (B, V)

    def _capture(self) -> None:
        # The warm-up steps write column ``width`` and unmask it; the first real step
        # rewrites that column before any read, so they leave no trace.
        stream = torch.cuda.Stream(self.column.device)
        stream.wait_stream(torch.cuda.current_stream(self.column.device))
        with torch.cuda.stream(stream):
            for _ in range(_WARMUP_STEPS):
                self._forward()
        torch.cuda.current_stream(self.column.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._forward()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` (B,) long, one per row; returns the next logits (B, V).

        The result is overwritten by the next step on a GPU: read it before stepping again.
        """
        self.tokens.copy_(tokens[:, None])
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
            assert logits is not None
        else:
            logits = self._forward()
        self.column.add_(1)
        self.positions.add_(1)
        return logits
