"""Learning-rate schedule of a run: a linear warm-up, and a cut after each rollback.

A pure function of the step and the rollback count, so a resumed run sets exactly the rates
the uninterrupted run would have (both are restored from the checkpoint).
"""

from __future__ import annotations


def lr_scale(
    step: int, warmup_steps: int, rollbacks: int = 0, rollback_scale: float = 1.0
) -> float:
    """Multiplier of the configured learning rates at training step ``step`` (from 0).

    Warm-up: steps 0 .. warmup_steps-1 use 1/(k+1), 2/(k+1), ..., k/(k+1) of the rate
    (k = warmup_steps), later steps all of it. Each rollback multiplies by ``rollback_scale``.
    """
    if step < 0 or warmup_steps < 0 or rollbacks < 0:
        raise ValueError(
            f"step, warmup_steps and rollbacks must be >= 0: {step, warmup_steps, rollbacks}"
        )
    warmup = min(1.0, (step + 1) / (warmup_steps + 1))
    return warmup * rollback_scale**rollbacks
