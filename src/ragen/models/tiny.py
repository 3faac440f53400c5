"""The ``tiny`` test model: a randomly initialised 2-layer Llama over the embedded tokenizer,
which runs every code path of a real model in a fraction of its time."""

from __future__ import annotations

import copy
from functools import lru_cache

import torch

# transformers' model and tokenizer classes are imported inside the functions that use them:
# importing them takes seconds, which commands that never load a model should not pay.


def tiny_config(vocab_size: int, eos_token_id: int | None):
    """The architecture of the ``tiny`` test model: a 2-layer Llama, hidden size 64."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )


def build_tiny(vocab_size: int, *, seed: int = 0, eos_token_id: int | None = None):
    """A randomly initialised 2-layer Llama (hidden 64) for tests: same code paths, ~3 M params.

    The embedding table dominates its size (vocab_size × 64). Each call returns a model of
    its own, a copy of the one initialised once per process for these arguments: the same
    weights, without initialising them again.
    """
    return copy.deepcopy(_initialised(vocab_size, seed, eos_token_id))


@lru_cache(maxsize=4)
def _initialised(vocab_size: int, seed: int, eos_token_id: int | None):
    """The tiny model as ``seed`` initialises it; only ever copied (see `build_tiny`)."""
    from transformers import LlamaForCausalLM

    # fork_rng keeps the caller's global RNG stream untouched by the initialisation.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_config(vocab_size, eos_token_id))
    return model.eval()
