"""Memory planning: how many rows decode together and how many episodes keep their caches.

Both are planned as shares of the device's whole memory, not of what happens to be free, so
that one machine sizes them alike on every run: which rows decode together changes a row's
samples at float rounding, so sizes taken from free memory would make two runs of one config
play different episodes. Where too little is free when a plan is made (other processes, or a
large model beside its trainer), the sizes shrink, the run warns (:data:`MEMORY_SHORT`) and
the generator counts the cut (``GenerationStats.memory_cuts``: a training step's
``perf/memory_cuts``, an evaluation's ``cost``), so a figure that may not repeat is marked.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ragen.host.memory import available_memory, total_memory
from ragen.rollout.engines.base import GenerationStats
from ragen.rollout.engines.kv_cache import kv_shape

# Largest batch the automatic choice picks: beyond 64 rows a CPU gains nothing per token,
# while on a GPU extra rows cost little time per decode step.
_MAX_AUTO_BATCH_CPU = 64
_MAX_AUTO_BATCH_GPU = 256
# Shares of the device's whole memory that the decode batch's KV cache (copied each step) and
# the caches kept between turns (all live episodes together) are planned to take.
_BATCH_SHARE = 0.2
_KEPT_SHARE = 0.3
# A plan never takes more than this share of the memory free when it is made.
_FREE_SHARE = 0.6
MEMORY_SHORT = (
    "free memory is short: ragen plans its decode batches and kept caches from the machine's "
    "whole memory so that runs repeat exactly, but too little of it is free now, so they "
    "shrink to fit; this run's samples can then differ, at float rounding, from a run with "
    "more memory free"
)


def _kv_bytes_per_token(model) -> int:
    layers, heads, head_dim = kv_shape(model)
    return layers * 2 * heads * head_dim * next(model.parameters()).element_size()


def _free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        # The driver counts the blocks torch's allocator keeps cached (after an update, its
        # activations) as used; torch hands them out again before asking the driver.
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    return available_memory()


def _total_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return total_memory()


@dataclass(frozen=True)
class Fit:
    """How many items to hold at once (``size``), and whether free memory made it smaller than
    the plan for the items at hand (``cut``): then which items go together, and so the
    samples at float rounding, can differ from a run with more memory free."""

    size: int
    cut: bool


def memory_fit(device: torch.device, share: float, item_bytes: int, wanted: int) -> Fit:
    """How many items of ``item_bytes`` to hold at once, at most ``wanted`` and at least 1:
    ``share`` of the device's whole memory, cut (with a warning) to ``_FREE_SHARE`` of the
    memory free now where less is free. ``wanted`` is the items at hand, so a cut is reported
    only where it changes how they are grouped."""
    planned = max(1, min(wanted, int(_total_memory(device) * share // item_bytes)))
    allowed = max(1, int(_free_memory(device) * _FREE_SHARE // item_bytes))
    if allowed < planned:
        warnings.warn(MEMORY_SHORT, stacklevel=3)
        return Fit(allowed, cut=True)
    return Fit(planned, cut=False)


def auto_max_batch(model, longest_tokens: int, rows: int) -> Fit:
    """How many of ``rows`` decode together: rows whose KV caches (held about three times over
    while decoding) fit the decode batch's share of memory, at most ``_MAX_AUTO_BATCH_CPU``
    (or ``_GPU``) rows."""
    per_row = 3 * _kv_bytes_per_token(model) * max(longest_tokens, 1)
    cap = _MAX_AUTO_BATCH_CPU if model.device.type == "cpu" else _MAX_AUTO_BATCH_GPU
    return memory_fit(model.device, _BATCH_SHARE, per_row, min(cap, max(rows, 1)))


def decode_batch(
    model, max_batch: int | None, longest_tokens: int, rows: int, stats: GenerationStats
) -> int:
    """How many of ``rows`` a generator decodes together: its own ``max_batch`` where set,
    else :func:`auto_max_batch`'s plan, a cut of which is counted in ``stats.memory_cuts``."""
    if max_batch:
        return max_batch
    fit = auto_max_batch(model, longest_tokens, rows)
    stats.memory_cuts += fit.cut
    return fit.size


def kept_cache_episodes(model, context_tokens: int, wanted: int) -> Fit:
    """Episodes, at most ``wanted``, whose caches, kept between turns (`CachedGenerator`) at up
    to ``context_tokens`` each, fit their share of memory: how many to play at once when the
    number is free to choose, as in an evaluation, whose hundreds of long episodes can keep
    more cache than a machine has beside a trainer."""
    per_episode = _kv_bytes_per_token(model) * max(context_tokens, 1)
    return memory_fit(model.device, _KEPT_SHARE, per_episode, wanted)
