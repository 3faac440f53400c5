"""How to hand a Hugging Face model its KV cache, on both sides of transformers' rename.

transformers 5 renamed the forward keyword ``past_key_values`` to ``cache``; the old name
warns on every call and goes away in 5.40. ragen supports releases on both sides of the
rename (pyproject's floor predates it) and models whose own code (``trust_remote_code``)
keeps the old name, so the keyword is read from the forward the call ends up in.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

from transformers.modeling_outputs import CausalLMOutputWithPast

OLD = "past_key_values"
NEW = "cache"


def cache_kwarg(model, cache) -> dict:
    """``{keyword: cache}`` to unpack into ``model(...)``."""
    return {cache_keyword(model): cache}


def cache_keyword(model) -> str:
    """The keyword ``model``'s forward takes its cache by: the first of ``model`` and the
    modules it wraps whose forward names one, else the installed transformers' own."""
    seen: set[int] = set()
    while model is not None and id(model) not in seen:
        seen.add(id(model))
        declared = _declared(type(model).forward)
        if declared:
            return declared
        model = _inner(model)
    return _installed()


def _inner(model):
    """The module a wrapper passes its keywords to (peft, DDP, torch.compile), or None."""
    base = getattr(model, "get_base_model", None)
    if callable(base):
        return base()
    for name in ("module", "_orig_mod"):
        inner = getattr(model, name, None)
        if inner is not None:
            return inner
    return None


@functools.cache
def _declared(forward) -> str | None:
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a builtin or C extension: nothing declared
        return None
    for name in (NEW, OLD):
        if name in parameters:
            return name
    return None


@functools.cache
def _installed() -> str:
    fields = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    return NEW if NEW in fields else OLD
