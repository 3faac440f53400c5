"""The KV-cache keyword follows the forward a call ends up in, through wrappers."""

from __future__ import annotations

import dataclasses

import torch
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from ragen import models
from ragen.models.kv_keyword import NEW, OLD, cache_keyword, cache_kwarg


class _OldStyle(torch.nn.Module):
    """A model whose own code keeps the pre-rename keyword (as remote code may)."""

    def forward(self, input_ids=None, past_key_values=None, use_cache=None):
        return input_ids


class _Passing(torch.nn.Module):
    """A wrapper in the manner of DDP: keywords go through to ``module``."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _installed_keyword() -> str:
    fields = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    return NEW if NEW in fields else OLD


def test_a_transformers_model_fills_the_cache_it_is_handed(tiny):
    # pyproject turns the deprecated keyword's FutureWarning into an error: this call would fail
    model, _ = tiny
    assert cache_keyword(model) == _installed_keyword()
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7]]), **cache_kwarg(model, cache), use_cache=True)
    assert cache.get_seq_length() == 3


def test_peft_and_pass_through_wrappers_name_what_the_inner_forward_takes(tiny):
    model, _ = tiny
    lora = models.apply_lora(models.build_tiny(model.config.vocab_size), 4, 8, ["q_proj"])
    assert cache_keyword(lora) == _installed_keyword()
    cache = DynamicCache(config=lora.config)
    with torch.no_grad():
        lora(input_ids=torch.tensor([[5, 6, 7, 8]]), **cache_kwarg(lora, cache), use_cache=True)
    assert cache.get_seq_length() == 4
    assert cache_keyword(_Passing(model)) == _installed_keyword()
    assert cache_keyword(_OldStyle()) == OLD
    assert cache_keyword(_Passing(_Passing(_OldStyle()))) == OLD
    assert cache_kwarg(_OldStyle(), "c") == {OLD: "c"}
