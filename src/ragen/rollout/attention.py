"""Prefill attention for grouped-query models that lets SDPA broadcast the key/value heads.

transformers' ``sdpa`` attention, given a mask, copies every key/value head ``H_q / H_kv``
times (``repeat_kv``) before a multi-token forward, because CUDA's SDPA falls back to its
slow kernel on a masked GQA call. The CPU kernel takes ``enable_gqa`` with a mask and gives
bit-identical outputs, so the copy is pure cost: for the generator's prefills (a few dozen
new tokens per row on top of ~1,000 cached ones) it was a quarter of the forward, since the
whole cache is copied in every layer. Single-token decode steps already avoid the copy
(transformers folds the query heads instead) and training forwards need their gradients
through the standard path, so both are left to ``sdpa``.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "ragen_gqa_sdpa"


def broadcasts_heads(query, key, attention_mask, dropout: float, kwargs: dict) -> bool:
    """Whether a call can attend with ``enable_gqa`` instead of copying the key/value heads:
    a masked multi-token forward on CPU, without gradients or sdpa's rarer options."""
    return (
        query.device.type == "cpu"
        and query.shape[2] > 1
        and key.shape[1] != query.shape[1]
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and dropout == 0.0
        and not torch.is_grad_enabled()
        and all(kwargs.get(k) is None for k in ("position_bias", "softcap", "cache"))
    )


def gqa_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``sdpa`` attention; masked no-grad multi-token forwards on CPU skip ``repeat_kv``.

    query: (B, H_q, N, D); key, value: (B, H_kv, K, D); attention_mask: (B, 1, N, K) bool,
    True where a query may attend. Returns (B, N, H_q, D), as every transformers attention.
    """
    if not broadcasts_heads(query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
    )  # (B, H_q, N, D)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, gqa_sdpa_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def gqa_prefill(model):
    """Run ``model`` with :func:`gqa_sdpa_forward` inside the block if it uses ``sdpa``.

    Scoped rather than set at load time: the generator's forwards are the ones it is for, and
    other code (the naive reference, training) keeps the model exactly as transformers made it.
    """
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
