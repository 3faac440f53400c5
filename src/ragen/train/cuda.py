"""What a training step asks of a CUDA device: attention kernels that add in a fixed order in
the backward, and the step's peak memory. On a CPU both are no-ops."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def deterministic_attention(device: torch.device, on: bool):
    """A context for the update: on CUDA with ``on``, attention on SDPA's math kernels.

    cuDNN's fused attention adds in a varying order in its backward, and torch's warn-only
    deterministic mode warns and runs it: a resumed run's weights can come out a few bits
    off the uninterrupted run's (docs/gpu.md). The math kernels are plain matrix products
    and a softmax.
    Forwards alone (rollouts, scoring) add in a fixed order and keep the fused kernels.
    """
    if device.type != "cuda" or not on:
        return nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


def gpu_memory_metrics(device: torch.device) -> dict[str, float]:
    """``perf/gpu_peak_gib``: the most GPU memory torch held at once since the last call
    (so, per step), on a CUDA device; nothing on a CPU."""
    if device.type != "cuda":
        return {}
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    torch.cuda.reset_peak_memory_stats(device)
    return {"perf/gpu_peak_gib": peak}
