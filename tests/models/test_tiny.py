"""The tiny test model: small, seeded, and quiet about the global RNG."""

import torch

from ragen import models


def test_tiny_model_is_small_seeded_and_runs(tiny):
    model, tokenizer = tiny
    assert model.config.num_hidden_layers == 2
    assert model.config.hidden_size == 64
    assert model.config.vocab_size == len(tokenizer) == 49152
    again = models.build_tiny(len(tokenizer), seed=0)
    other = models.build_tiny(len(tokenizer), seed=1)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(model.state_dict()[weight], again.state_dict()[weight])
    assert not torch.equal(model.state_dict()[weight], other.state_dict()[weight])
    ids = torch.tensor([tokenizer("hello world")["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], 49152)


def test_building_tiny_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    models.build_tiny(1000, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_each_tiny_model_is_its_own_with_its_head_tied():
    a, b = models.build_tiny(1000, seed=3), models.build_tiny(1000, seed=3)
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)
    with torch.no_grad():
        a.lm_head.weight.add_(1.0)  # trains one: the next copy starts where both started
    assert not torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert torch.equal(models.build_tiny(1000, seed=3).lm_head.weight, b.lm_head.weight)
    assert a.lm_head.weight is a.model.embed_tokens.weight  # tied, as the config says
    assert b.lm_head.weight is b.model.embed_tokens.weight
