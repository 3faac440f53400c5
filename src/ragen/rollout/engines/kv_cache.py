"""KV caches in preallocated buffers, and the decode batch that holds one.

A batch's cache holds, per layer, a (2, B, H_kv, capacity, D) buffer: keys then values of
each row, right-aligned (left-padded) in their first columns, with room for the tokens fed
later, which are written in place. :func:`row_kv` reads one row's real tokens back out as the
(layers, 2, H_kv, L, D) tensor the cached engine keeps per episode; :func:`drop_rows` takes
finished rows out of a :class:`Batch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


def kv_shape(model) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim) of a transformers decoder."""
    config = model.config.get_text_config()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, heads, head_dim


class BufferLayer(DynamicLayer):
    """A DynamicLayer whose keys/values live in a preallocated buffer.

    DynamicLayer concatenates on every update, copying the whole cache each decode step,
    which dominated a decode step's time. Here a step writes its column in place and
    ``keys``/``values`` are views of the filled part.
    """

    def __init__(self, kv: torch.Tensor, length: int):  # kv: (2, B, H_kv, capacity, D)
        super().__init__()
        self.dtype, self.device, self.is_initialized = kv.dtype, kv.device, True
        self.buffer = kv
        self._fill(length)

    def _fill(self, length: int) -> None:
        self.length = length
        self.keys = self.buffer[0, :, :, :length]  # (B, H_kv, length, D)
        self.values = self.buffer[1, :, :, :length]

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[-2]
        if self.length + n > self.buffer.shape[3]:
            raise RuntimeError("KV buffer too small: the generator sized it wrongly")
        self.buffer[0, :, :, self.length : self.length + n] = key_states
        self.buffer[1, :, :, self.length : self.length + n] = value_states
        self._fill(self.length + n)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def move_rows(self, holes: list[int], movers: list[int], rows: int) -> None:
        """Copy rows ``movers`` into rows ``holes``, then keep the first ``rows`` rows."""
        if holes:
            dst, src = torch.tensor(holes), torch.tensor(movers)
            filled = slice(0, self.length)
            self.buffer[:, dst, :, filled] = self.buffer[:, src, :, filled]
        self.buffer = self.buffer[:, :rows]
        self._fill(self.length)


class BufferCache(DynamicCache):
    """A DynamicCache made of :class:`BufferLayer` s."""

    # transformers types `layers` as a list of every layer kind; __init__ puts only
    # BufferLayer s in it, whose buffers move_rows and row_kv use.
    layers: list[BufferLayer]  # type: ignore[assignment]

    def __init__(self, layers: list[BufferLayer]):
        Cache.__init__(self, layers=list(layers))

    def move_rows(self, holes: list[int], movers: list[int], rows: int) -> None:
        for layer in self.layers:
            layer.move_rows(holes, movers, rows)


def padded_cache(sources: Sequence[torch.Tensor | None], width: int, capacity: int):
    """A cache holding each row's keys/values right-aligned in its first ``width`` columns.

    sources: per row (layers, 2, H_kv, L_b, D) with L_b <= width, or None for an empty row.
    ``capacity`` columns are allocated, so the tokens fed later are written in place.
    """
    first = next(s for s in sources if s is not None)
    n_layers, _, heads, _, dim = first.shape
    layers = []
    for n in range(n_layers):
        kv = first.new_empty((2, len(sources), heads, capacity, dim))  # (2, B, H_kv, cap, D)
        for b, source in enumerate(sources):
            filled = 0 if source is None else source.shape[3]
            # Masked columns still enter the attention product (weight 0 × value), so they
            # must hold zeros, never leftover NaN bits. Columns past ``width`` are written
            # before they are read.
            kv[:, b, :, : width - filled] = 0
            if source is not None:
                kv[:, b, :, width - filled : width] = source[n]
        layers.append(BufferLayer(kv, width))
    return BufferCache(layers)


def empty_cache(model, batch: int, capacity: int):
    """A cache of ``capacity`` empty columns for ``batch`` rows of ``model``."""
    layers, heads, head_dim = kv_shape(model)
    param = next(model.parameters())
    shape = (2, batch, heads, capacity, head_dim)
    # Every column is written (by the prefill chunk) before it is read.
    return BufferCache([BufferLayer(param.new_empty(shape), 0) for _ in range(layers)])


def spans(columns: torch.Tensor) -> list[tuple[int, int]]:
    """The runs of True in a (K,) bool mask, as [start, end) pairs."""
    edge = torch.zeros(1, dtype=torch.int8)
    flips = torch.diff(columns.to("cpu", torch.int8), prepend=edge, append=edge)
    bounds = flips.nonzero().flatten().tolist()  # start, end, start, end, ...
    return list(zip(bounds[::2], bounds[1::2], strict=True))


def row_kv(
    cache: BufferCache, b: int, columns: torch.Tensor, prefix: torch.Tensor | None = None
) -> torch.Tensor:
    """Row ``b``'s keys/values at the real-token ``columns`` (K,) bool → (layers, 2, H, L, D),
    after ``prefix`` (layers, 2, H, P, D) when the batch holds one.

    The real tokens lie in one or two runs of columns (cache, then the fed chunk), so they
    are copied run by run straight into the result: a boolean index would copy them twice.
    """
    runs = spans(columns)
    first = cache.layers[0].buffer  # (2, B, H_kv, capacity, D)
    _, _, heads, _, dim = first.shape
    shared = 0 if prefix is None else prefix.shape[3]
    total = shared + sum(end - start for start, end in runs)
    out = first.new_empty((len(cache.layers), 2, heads, total, dim))
    if prefix is not None:
        out[:, :, :, :shared] = prefix
    for n, layer in enumerate(cache.layers):
        at = shared
        for start, end in runs:
            out[n, :, :, at : at + end - start] = layer.buffer[:, b, :, start:end]
            at += end - start
    return out


@dataclass
class Batch:
    """The rows being decoded together; row ``b`` is request ``index[b]``."""

    index: list[int]
    cache: BufferCache  # (B, H_kv, K, D) keys and values per layer, left-padded
    mask: torch.Tensor  # (B, K) bool: which cache columns hold a real token of the row
    # (layers, 2, H_kv, P, D): the P leading tokens every row shares, held once and not in
    # ``cache`` (whose columns then follow them); None: each row's cache holds all its tokens.
    prefix: torch.Tensor | None
    positions: torch.Tensor  # (B,) long: position of the next token fed to each row
    logits: torch.Tensor  # (B, V): the distribution of each row's next token
    replies: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[float]] = field(default_factory=dict)


def drop_rows(batch: Batch, finished: list[int], tokens: torch.Tensor) -> torch.Tensor:
    """Remove the ``finished`` rows (ascending) from the batch; returns the live rows' tokens.

    The last live rows move into the finished rows' places and the batch is cut short, so
    only the moved rows' caches are copied, where compacting by an index would copy every
    row's cache at every finish.
    """
    size = len(batch.index)
    gone = set(finished)
    live = size - len(gone)
    holes = [b for b in finished if b < live]
    movers = [b for b in range(live, size) if b not in gone]  # as many as holes
    order = list(range(live))  # new row -> old row
    for hole, mover in zip(holes, movers, strict=True):
        order[hole] = mover
    batch.cache.move_rows(holes, movers, live)
    keep = torch.tensor(order)
    batch.mask, batch.positions = batch.mask[keep], batch.positions[keep]
    batch.index = [batch.index[b] for b in order]
    return tokens[keep.to(tokens.device)]
