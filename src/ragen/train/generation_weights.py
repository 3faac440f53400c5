"""The weights the rollout samples with: the policy's float32 master weights, or a copy of
them in ``model.dtype`` that follows every change of the master.

Sampling in bf16 where the CPU runs it natively (AVX512-BF16, AMX) decodes about 1.5× faster
than float32 here (``benchmarks/generator.py --dtype``), and a GPU's bf16 more. The update
keeps training the float32 master weights; each rollout starts by copying them into the
copy if they changed since the last one (an optimiser step, a rollback, a resumed
checkpoint). The old log-probs are the update's own, so the ratio it clips is between the
update's forwards; the sampler's rounding is outside it, as with any engine that samples
in another precision than it trains (vLLM's bf16 beside float32 master weights).
"""

from __future__ import annotations

import copy

import torch

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
        if dtype != next(master.parameters()).dtype:
            self.model = copy.deepcopy(master).eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
                p.data = p.data.to(dtype)
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
            pairs = zip(self.model.parameters(), self.master.parameters(), strict=True)
            for mine, theirs in pairs:
                mine.copy_(theirs)  # bumps the copy's versions: the generator drops its caches
        self._version = version
