"""The weights the rollout samples with: the policy's float32 master weights, or a copy of
them in ``model.dtype`` that follows every change of the master.

Sampling in bf16 where the CPU runs it natively (AVX512-BF16, AMX) decodes faster than
float32 (``benchmarks/generator.py --dtype``; docs/performance.md), and a GPU's bf16 more.
The update keeps training the float32 master weights; each rollout starts by copying them
into the copy if they changed since the last one (an optimiser step, a rollback, a resumed
checkpoint). The old log-probs are the update's own, so the ratio it clips is between the
update's forwards; the sampler's rounding is outside it, as with any engine that samples
in another precision than it trains (vLLM's bf16 beside float32 master weights).

A LoRA master (peft) is copied with its adapters merged in: each adapted layer's weight is
``W + ΔW`` (peft's own delta: ``scaling * B @ A``), summed in the master's dtype and then
cast, so the rollout decodes a plain model, without the adapters' extra matmuls per layer.
Each refresh recomputes the adapted weights from the frozen base and the trained adapters.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ragen.models.lora import is_lora, merged_copy
from ragen.rollout.engines.base import weights_version

COPYING_BACKENDS = frozenset({"hf", "naive"})
"""Backends that sample with the trainer's model object; the vLLM engines load their own
weights in their own dtype."""


class GenerationWeights:
    """The model the rollout's generator holds: ``master`` itself, or its copy in ``dtype``.

    Only the parameters are cast: buffers (the rotary frequencies) stay as loaded, as
    ``from_pretrained(dtype=...)`` keeps them.
    """

    def __init__(self, master: torch.nn.Module, dtype: torch.dtype) -> None:
        self.master = master
        self.model = master
        self._version: int | None = None
        self._sources: list[tuple[torch.Tensor, Any]] = []
        if dtype != next(master.parameters()).dtype:
            lora = is_lora(master)
            self.model = frozen_in(merged_copy(master) if lora else copy.deepcopy(master), dtype)
            self._sources = _sources(self.model, master) if lora else []
            self._version = weights_version(master)

    @property
    def copied(self) -> bool:
        return self.model is not self.master

    def refresh(self) -> None:
        """Copy the master weights into the copy if they changed since the last refresh."""
        if not self.copied:
            return
        version = weights_version(self.master)
        if version == self._version:
            return
        with torch.no_grad():
            if self._sources:
                for mine, source in self._sources:
                    mine.copy_(source if isinstance(source, torch.Tensor) else _merged(source))
            else:
                pairs = zip(self.model.parameters(), self.master.parameters(), strict=True)
                for mine, theirs in pairs:
                    mine.copy_(theirs)  # bumps the copy's versions: the generator drops caches
        self._version = version


def frozen_in(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model`` itself, in eval mode, its parameters cast to ``dtype`` and frozen (buffers
    stay as they are)."""
    for p in model.parameters():
        p.requires_grad_(False)
        p.data = p.data.to(dtype)
    return model.eval()


def _sources(merged: torch.nn.Module, master: Any) -> list[tuple[torch.Tensor, Any]]:
    """Each parameter of the ``merged`` copy of a peft ``master``, with what it copies:
    the master's parameter of the same place (a tensor), or the LoRA layer whose merged
    weight it is (peft's ``LoraLayer``)."""
    from peft.tuners.lora import LoraLayer

    base = master.get_base_model()  # the underlying model, its LoRA layers in place
    found: dict[str, Any] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            found[f"{name}.weight"] = module
    for name, p in base.named_parameters():
        if ".lora_" not in name:
            found.setdefault(name.replace(".base_layer.", "."), p)
    return [(p, found[name]) for name, p in merged.named_parameters()]


def _merged(layer) -> torch.Tensor:
    """A LoRA layer's weight with its active adapters added: ``W + sum ΔW``."""
    weight = layer.get_base_layer().weight
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:  # an adapter may leave this layer out
            weight = weight + layer.get_delta_weight(adapter)
    return weight
