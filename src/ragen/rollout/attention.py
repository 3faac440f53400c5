"""transformers' SDPA attention, with decoding of grouped-query models kept off a slow kernel.

When a decode step's rows all have the same length, transformers passes no mask and asks
``scaled_dot_product_attention`` for ``enable_gqa``; with a mask it folds each key/value
head's query heads into one row of queries instead (its ``pack_gqa``). On the CPU the
first is several times slower than the second on the same cache in bf16 (SmolLM2-135M: 9
query heads over 3 key/value heads; ``python benchmarks/attention.py`` measures both; in
float32 the two were level in ``benchmarks/decode.py``). Spaced grids give
every level's first prompt the same number of tokens, so whole turns of rollouts and
evaluations decoded on the slow kernel. :data:`NAME` is transformers' own SDPA attention
except that a single new token of a grouped-query model always takes the folded form, with or
without a mask; every other call (prefill, training forwards) is passed through unchanged.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "ragen_sdpa"
"""The attention implementation :func:`use_decode_attention` gives a model."""


def decode_attention(module, query, key, value, attention_mask, **kwargs):
    """An attention function for transformers' ``AttentionInterface``.

    query: (B, H, Q, D); key, value: (B, H_kv, K, D); attention_mask: (B, 1, Q, K) bool or
    None. Returns ((B, Q, H, D), None), as ``sdpa_attention_forward`` does, which it calls
    for everything but one new token of a grouped-query model without a mask.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    plain = kwargs.get("position_bias") is None and not kwargs.get("dropout")
    if query.shape[2] != 1 or groups == 1 or attention_mask is not None or not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    rows, heads, _, dim = query.shape
    # The query heads sharing a key/value head become that head's queries: (B, H_kv, G, D).
    folded = query.reshape(rows, heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        folded, key, value, scale=kwargs.get("scaling")
    )  # (B, H_kv, G, D)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, decode_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_decode_attention(model) -> None:
    """Give ``model`` :data:`NAME` in place of transformers' ``sdpa`` (any other is kept)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
