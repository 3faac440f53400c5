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
