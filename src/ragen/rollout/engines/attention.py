"""transformers' SDPA attention, with decoding of grouped-query models kept off a slow kernel.

When a decode step's rows all have the same length, transformers passes no mask and asks
``scaled_dot_product_attention`` for ``enable_gqa``; with a mask it folds each key/value
head's query heads into one row of queries instead (its ``pack_gqa``). On the CPU the first
is several times slower than the second on the same cache in bf16 (``python -m
benchmarks.attention`` measures both). Spaced grids give every level's first prompt the
same number of tokens, so whole turns of rollouts and evaluations would decode on the slow
kernel. :data:`NAME` is transformers' own SDPA attention except that a single new token of a
grouped-query model always takes the folded form, with or without a mask; every other call
(prefill, training forwards) is passed through unchanged.

A decode step may also be given the keys and values that every row of its batch starts with
(:data:`PREFIX_KEYWORD`, on the CPU): rollouts share a long opening (system line, worked
examples, rules), and attending to each row's copy of it reads the same keys once per row.
With the prefix held once, all rows' queries attend to it as one problem per key/value head,
their own columns as before, and the two partial results are merged by their log-sum-exp:
exact up to float rounding.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "ragen_sdpa"
"""The attention implementation :func:`use_decode_attention` gives a model."""

PREFIX_KEYWORD = "shared_prefix"
"""The model keyword that passes a decode step the prefix its rows share: (layers, 2, H_kv, P,
D), each layer's keys then values; the cache then holds only each row's columns after it."""


def decode_attention(module, query, key, value, attention_mask, **kwargs):
    """An attention function for transformers' ``AttentionInterface``.

    query: (B, H, Q, D); key, value: (B, H_kv, K, D); attention_mask: (B, 1, Q, K) bool or
    None. Returns ((B, Q, H, D), None), as ``sdpa_attention_forward`` does, which it calls
    for everything but one new token of a grouped-query model without a mask, and a decode
    step given :data:`PREFIX_KEYWORD` (then ``key``/``value`` are the columns after it).
    """
    prefix = kwargs.pop(PREFIX_KEYWORD, None)
    groups = getattr(module, "num_key_value_groups", 1)
    plain = kwargs.get("position_bias") is None and not kwargs.get("dropout")
    if prefix is not None:
        if query.shape[2] != 1 or not plain:
            raise ValueError(f"{PREFIX_KEYWORD} is for decode steps: one new token per row")
        shared = prefix[module.layer_idx]  # (2, H_kv, P, D)
        return _cascade(query, key, value, attention_mask, shared, groups, kwargs.get("scaling"))
    if query.shape[2] != 1 or groups == 1 or attention_mask is not None or not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    rows, heads, _, dim = query.shape
    # The query heads sharing a key/value head become that head's queries: (B, H_kv, G, D).
    folded = query.reshape(rows, heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        folded, key, value, scale=kwargs.get("scaling")
    )  # (B, H_kv, G, D)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


def _cascade(query, key, value, mask, shared, groups: int, scale: float | None):
    """One decode step over a shared prefix and each row's own columns.

    query: (B, H, 1, D); key, value: (B, H_kv, S, D), each row's columns after the prefix;
    mask: (B, 1, 1, S) bool (True: attend) or None; shared: (2, H_kv, P, D). Returns
    ((B, 1, H, D), None).
    """
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    rows, heads, _, dim = query.shape
    kv_heads = heads // groups
    folded = query.reshape(rows, kv_heads, groups, dim)  # (B, H_kv, G, D)
    # Every row's queries of a key/value head attend to its prefix keys together: (1, H_kv, B·G, D).
    together = folded.transpose(0, 1).reshape(1, kv_heads, rows * groups, dim)
    out_p, lse_p = flash(together, shared[0][None], shared[1][None], scale=scale)
    out_p = out_p.reshape(kv_heads, rows, groups, dim).transpose(0, 1)  # (B, H_kv, G, D)
    lse_p = lse_p.reshape(kv_heads, rows, groups).transpose(0, 1)  # (B, H_kv, G)
    if mask is not None:  # the kernel takes an additive mask of the query's dtype
        additive = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
        mask = additive.masked_fill_(~mask, float("-inf"))
    out_s, lse_s = flash(folded, key, value, attn_mask=mask, scale=scale)
    lse = torch.logaddexp(lse_p, lse_s)
    out = out_p * (lse_p - lse).exp()[..., None] + out_s * (lse_s - lse).exp()[..., None]
    return out.to(query.dtype).reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, decode_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_decode_attention(model) -> None:
    """Give ``model`` :data:`NAME` in place of transformers' ``sdpa`` (any other is kept)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
