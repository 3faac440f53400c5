"""The generator's GQA prefill attention: the same numbers as transformers' sdpa, scoped.

The tiny Llama has 4 query heads over 2 key/value heads, so its masked prefills take the
path that skips ``repeat_kv``.
"""

from __future__ import annotations

import torch

from ragen.rollout.attention import NAME, broadcasts_heads, gqa_prefill
from ragen.rollout.generator import _empty_cache


def _prefill_on_cache(model, *, grad: bool) -> torch.Tensor:
    """Logits (B, 6, V) of a left-padded 6-token chunk over a 10-token cache with holes."""
    torch.manual_seed(0)
    cache = _empty_cache(model, 3, 16)
    with torch.no_grad():
        model(input_ids=torch.randint(5, 500, (3, 10)), past_key_values=cache, use_cache=True)
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[0, :4] = 0  # row 0: a shorter cached context
    mask[1, 10:12] = 0  # row 1: a left-padded chunk
    positions = (mask.cumsum(1) - 1).clamp(min=0)[:, 10:]
    with torch.set_grad_enabled(grad):
        out = model(
            input_ids=torch.randint(5, 500, (3, 6)),
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
    return out.logits.detach()


def test_gqa_prefill_gives_sdpa_numbers_exactly(tiny):
    model, _ = tiny
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    reference = _prefill_on_cache(model, grad=False)
    with gqa_prefill(model):
        assert model.config._attn_implementation == NAME
        fast = _prefill_on_cache(model, grad=False)
        with_grad = _prefill_on_cache(model, grad=True)  # the standard path
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(fast, reference)
    torch.testing.assert_close(with_grad, reference, rtol=0, atol=1e-6)


def test_gqa_prefill_restores_the_implementation_after_an_error(tiny):
    model, _ = tiny
    try:
        with gqa_prefill(model):
            raise RuntimeError("a forward failed")
    except RuntimeError:
        pass
    assert model.config._attn_implementation == "sdpa"


def test_gqa_prefill_leaves_other_implementations_alone(tiny):
    model, _ = tiny
    model.set_attn_implementation("eager")
    try:
        with gqa_prefill(model):
            assert model.config._attn_implementation == "eager"
    finally:
        model.set_attn_implementation("sdpa")


def test_only_masked_no_grad_multi_token_gqa_calls_broadcast():
    q, k = torch.zeros(2, 4, 3, 8), torch.zeros(2, 2, 5, 8)
    mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    with torch.no_grad():
        assert broadcasts_heads(q, k, mask, 0.0, {})
        assert not broadcasts_heads(q[:, :, :1], k, mask[:, :, :1], 0.0, {})  # decode step
        assert not broadcasts_heads(q, torch.zeros(2, 4, 5, 8), mask, 0.0, {})  # no GQA
        assert not broadcasts_heads(q, k, None, 0.0, {})  # sdpa's causal path
        assert not broadcasts_heads(q, k, mask.float(), 0.0, {})  # additive mask
        assert not broadcasts_heads(q, k, mask, 0.1, {})  # dropout
        assert not broadcasts_heads(q, k, mask, 0.0, {"softcap": 30.0})
    assert not broadcasts_heads(q, k, mask, 0.0, {})  # gradients on: training
