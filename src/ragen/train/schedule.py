"""Learning-rate schedule of a run: a linear warm-up, a decay to the run's end, and a cut
after each rollback.

A pure function of the step and the rollback count, so a resumed run sets exactly the rates
the uninterrupted run would have (both are restored from the checkpoint).
"""

from __future__ import annotations

import math

import torch

from ragen.config import Config


def lr_scale(
    step: int,
    warmup_steps: int,
    rollbacks: int = 0,
    rollback_scale: float = 1.0,
    *,
    decay: str = "none",
    steps: int = 0,
) -> float:
    """Multiplier of the configured learning rates at training step ``step`` (from 0).

    Warm-up: steps 0 .. warmup_steps-1 use 1/(k+1), 2/(k+1), ..., k/(k+1) of the rate
    (k = warmup_steps), later steps all of it. Decay (trainer.lr_decay, over a run of
    ``steps``): step s >= k is at progress p = (s - k) / (steps - k), and uses 1 - p of
    the rate (linear) or (1 + cos(pi p)) / 2 (cosine); none keeps it. Each rollback
    multiplies by ``rollback_scale``.
    """
    if step < 0 or warmup_steps < 0 or rollbacks < 0:
        raise ValueError(
            f"step, warmup_steps and rollbacks must be >= 0: {step, warmup_steps, rollbacks}"
        )
    scale = min(1.0, (step + 1) / (warmup_steps + 1))
    if decay != "none" and step >= warmup_steps:
        progress = min(1.0, (step - warmup_steps) / max(steps - warmup_steps, 1))
        if decay == "linear":
            scale = 1.0 - progress
        elif decay == "cosine":
            scale = (1.0 + math.cos(math.pi * progress)) / 2.0
        else:
            raise ValueError(f"decay must be none, linear or cosine; got {decay!r}")
    return scale * rollback_scale**rollbacks


def set_learning_rates(
    optimizers: dict[str, torch.optim.Optimizer], config: Config, step: int, rollbacks: int
) -> float:
    """Set the RL optimisers' rates (``actor``, ``critic``) for ``step`` from the configured
    ones, after ``rollbacks`` rollbacks; returns the scale (``lr_scale``)."""
    t = config.trainer
    scale = lr_scale(
        step,
        t.lr_warmup_steps,
        rollbacks,
        config.monitor.rollback_lr_scale,
        decay=t.lr_decay,
        steps=t.steps,
    )
    base = {"actor": t.actor_lr, "critic": t.critic_lr}
    for name, opt in optimizers.items():
        for group in opt.param_groups:
            group["lr"] = base[name] * scale
    return scale


def set_sft_learning_rate(optimizer: torch.optim.Optimizer, config: Config, step: int) -> float:
    """Set `ragen sft`'s rate for ``step``: sft.lr, decayed over sft.steps by
    trainer.lr_decay (no warm-up, no rollbacks); returns the rate."""
    lr = config.sft.lr * lr_scale(step, 0, decay=config.trainer.lr_decay, steps=config.sft.steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
