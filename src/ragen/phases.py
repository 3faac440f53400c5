"""Wall time per phase of a training step, for metrics.jsonl and `benchmarks/step.py`.

The rollout, scoring and update code wrap their phases in ``timed(name)``; the trainer
``drain()`` s the totals once per step and logs them as ``time/<name>_s``. A phase entered
several times in a step (a decode per turn, a backward per micro-batch) adds up.

Phases nest only where a name says so (``rollout_decode`` runs inside the step's rollout,
never inside another timed phase), so the totals of different names never overlap and
their sum is at most the step's wall time. On a GPU the clock synchronises the device at the
end of each phase, so a phase is charged for the kernels it queued, not only for queueing.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch

ROLLOUT_ENV = "rollout_env"
"""Env steps, reply parsing and the dialogue's text and tokens: the rollout's non-model work."""
ROLLOUT_PREFILL = "rollout_prefill"
"""Context tokens through the model before decoding (backends that split it: ``hf``)."""
ROLLOUT_DECODE = "rollout_decode"
"""Token-by-token sampling (``hf``; with ``naive`` its whole ``generate``, prefill included)."""
SCORE = "score"
ADVANTAGES = "advantages"
UPDATE_FORWARD = "update_forward"
UPDATE_BACKWARD = "update_backward"
UPDATE_OPTIMIZER = "update_optimizer"

NAMES = (
    ROLLOUT_ENV,
    ROLLOUT_PREFILL,
    ROLLOUT_DECODE,
    SCORE,
    ADVANTAGES,
    UPDATE_FORWARD,
    UPDATE_BACKWARD,
    UPDATE_OPTIMIZER,
)
"""Every phase the library times, in the order a step runs them."""

_spent: dict[str, float] = defaultdict(float)


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Add the wall time of the ``with`` body to phase ``name`` (one of ``NAMES``)."""
    if name not in NAMES:
        raise ValueError(f"unknown phase {name!r}; phases are {', '.join(NAMES)}")
    started = time.perf_counter()
    try:
        yield
    finally:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        _spent[name] += time.perf_counter() - started


@contextmanager
def untimed() -> Iterator[None]:
    """Within it, phases add nothing: the work of something that is no phase of the step
    (the gradient reporter's passes) leaves the step's totals as they were."""
    saved = dict(_spent)
    try:
        yield
    finally:
        _spent.clear()
        _spent.update(saved)


def totals() -> dict[str, float]:
    """The seconds spent in each phase since the last drain, leaving them to be drained."""
    return {name: _spent.get(name, 0.0) for name in NAMES}


def drain() -> dict[str, float]:
    """The seconds spent in each phase since the last drain (phases not entered: 0), and a
    fresh start for the next step."""
    spent = totals()
    _spent.clear()
    return spent


def metric(name: str) -> str:
    """The metrics.jsonl name of phase ``name``."""
    return f"time/{name}_s"
