"""The decode attention: transformers' SDPA, with one new token of a grouped-query model
computed on the folded queries whether or not a mask is given."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ragen import models
from ragen.rollout.engines import Request, make_generator
from ragen.rollout.engines.attention import (
    NAME,
    PREFIX_KEYWORD,
    decode_attention,
    use_decode_attention,
)


def _fresh_tiny(tokenizer):
    model = models.build_tiny(len(tokenizer), seed=3, eos_token_id=tokenizer.eos_token_id)
    assert model.config._attn_implementation == "sdpa"
    assert model.config.num_attention_heads // model.config.num_key_value_heads == 2
    return model


def _logits(model, ids, mask, step):
    """Logits of one decode step after a prefill of ``ids`` (B, L) → (B, V)."""
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        full = torch.cat([mask, torch.ones(len(ids), 1, dtype=mask.dtype)], 1)
        return model(
            input_ids=step, attention_mask=full, cache=out.past_key_values, use_cache=True
        ).logits[:, -1]


@pytest.mark.parametrize("padded", [False, True], ids=["same-length rows", "left-padded rows"])
def test_decode_step_equals_sdpa(tiny, padded):
    tokenizer = tiny[1]
    model = _fresh_tiny(tokenizer)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 400, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    if padded:
        mask[0, :5] = 0  # row 0 is 7 tokens long
    step = torch.randint(10, 400, (3, 1), generator=g)
    before = _logits(model, ids, mask, step)
    use_decode_attention(model)
    assert model.config._attn_implementation == NAME
    after = _logits(model, ids, mask, step)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)


def test_prefill_and_training_forward_are_passed_through_unchanged(tiny):
    tokenizer = tiny[1]
    model = _fresh_tiny(tokenizer)
    ids = torch.randint(10, 400, (2, 9), generator=torch.Generator().manual_seed(1))
    before = model(input_ids=ids).logits
    before.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    use_decode_attention(model)
    after = model(input_ids=ids).logits
    after.sum().backward()
    assert torch.equal(after, before)
    for p, g in zip(model.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)


def test_other_implementations_are_kept(tiny):
    model = _fresh_tiny(tiny[1])
    model.set_attn_implementation("eager")
    use_decode_attention(model)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("backend", ["hf", "naive"])
def test_model_attention_picks_the_kernel_and_both_sample_alike(tiny, backend):
    tokenizer = tiny[1]
    # Rows of one length: the decode steps carry no mask, the case the folding is for.
    requests = [Request(key=i, context_ids=[5, 6, 7, 8 + i]) for i in range(3)]
    samples = {}
    for attention, implementation in (("ragen", NAME), ("sdpa", "sdpa")):
        model = _fresh_tiny(tokenizer)
        generator = make_generator(backend, model, tokenizer, attention=attention)
        assert model.config._attn_implementation == implementation
        samples[attention] = generator.generate(requests, max_new_tokens=6, temperature=1.0, seed=0)
    ours, reference = samples["ragen"], samples["sdpa"]
    assert [s.token_ids for s in ours] == [s.token_ids for s in reference]
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("padded", [False, True], ids=["same-length rows", "left-padded rows"])
def test_a_shared_prefix_held_once_gives_the_full_cache_attention(padded):
    """Queries over [shared prefix | own columns] equal SDPA over each row's whole cache."""
    g = torch.Generator().manual_seed(4)
    rows, heads, kv_heads, dim, shared, own = 3, 6, 2, 8, 11, 7
    query = torch.randn(rows, heads, 1, dim, generator=g)
    prefix = torch.randn(2, kv_heads, shared, dim, generator=g)
    key, value = torch.randn(2, rows, kv_heads, own, dim, generator=g)
    mask = torch.ones(rows, 1, 1, own, dtype=torch.bool)
    if padded:
        mask[1, ..., :4] = False  # row 1 has 3 own columns
    layer = SimpleNamespace(num_key_value_groups=heads // kv_heads, layer_idx=1, is_causal=True)
    layers = torch.stack([torch.zeros_like(prefix), prefix])  # the prefix of layers 0 and 1
    out, _ = decode_attention(
        layer, query, key, value, mask if padded else None, scaling=0.3, **{PREFIX_KEYWORD: layers}
    )
    whole_key = torch.cat([prefix[0].expand(rows, -1, -1, -1), key], 2)  # (B, H_kv, P + S, D)
    whole_value = torch.cat([prefix[1].expand(rows, -1, -1, -1), value], 2)
    whole_mask = torch.cat([torch.ones(rows, 1, 1, shared, dtype=torch.bool), mask], 3)
    reference = torch.nn.functional.scaled_dot_product_attention(
        query, whole_key, whole_value, attn_mask=whole_mask, scale=0.3, enable_gqa=True
    ).transpose(1, 2)  # (B, 1, H, D)
    assert out.shape == (rows, 1, heads, dim)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-6)


def test_a_shared_prefix_is_refused_outside_a_decode_step():
    layer = SimpleNamespace(num_key_value_groups=1, layer_idx=0, is_causal=True)
    query, key = torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="decode steps"):
        prefix = torch.zeros(1, 2, 2, 1, 4)
        decode_attention(layer, query, key, key, None, **{PREFIX_KEYWORD: prefix})
