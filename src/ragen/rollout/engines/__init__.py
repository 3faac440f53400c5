"""Text generation engines for the rollout loop, by ``rollout.backend`` name.

- ``hf`` (cached.py, the default): transformers forwards with KV caches kept per episode
  between calls (kv_cache.py), shared prefills, and on a GPU decode steps replayed from a
  captured CUDA graph (static_decode.py);
- ``naive`` (naive.py): ``model.generate`` over every full context, the reference;
- ``vllm`` / ``vllm-cpu`` (vllm.py): a vLLM engine serving the policy's current weights.

All meet one interface (base.py: :class:`Request` in, :class:`Sample` out, one ``generate``
that checks and counts each call) and share the sampling and stop rules, so they play the
same episodes. memory.py sizes decode batches and kept caches from the device's memory;
attention.py is the decode attention the ``hf`` and ``naive`` engines give the model.

    from ragen.rollout.engines import Request, make_generator
    generator = make_generator("hf", model, tokenizer)
    [sample] = generator.generate([Request("episode-0", ids)], max_new_tokens=64, temperature=1.0)
"""

from ragen.rollout.engines.backends import make_generator
from ragen.rollout.engines.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationStats,
    Generator,
    Request,
    Sample,
    Stopper,
    eos_ids,
)
from ragen.rollout.engines.cached import CachedGenerator
from ragen.rollout.engines.naive import NaiveGenerator

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "CachedGenerator",
    "GenerationStats",
    "Generator",
    "NaiveGenerator",
    "Request",
    "Sample",
    "Stopper",
    "eos_ids",
    "make_generator",
]
