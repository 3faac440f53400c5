"""Synthetic metric streams for the detector and report tests: a healthy run that learns and
plateaus, and one that follows the paper's collapse (std and entropy fall first, then the
reward, then gradient-norm spikes)."""

from __future__ import annotations

import numpy as np


def _ramp(steps: int, start: int, end: int, a: float, b: float) -> np.ndarray:
    """a before ``start``, b after ``end``, linear in between. (steps,)"""
    t = np.clip((np.arange(steps) - start) / max(1, end - start), 0.0, 1.0)
    return a + (b - a) * t


def healthy(seed: int, steps: int = 200) -> list[dict]:
    """Reward rises and plateaus; std and entropy decay gently; noise on everything."""
    rng = np.random.default_rng(seed)
    reward = _ramp(steps, 0, 60, 0.1, 0.7)
    return _records(
        rng,
        reward=reward + rng.normal(0, 0.05, steps),
        success=np.clip(reward + rng.normal(0, 0.05, steps), 0, 1),
        std=_ramp(steps, 0, steps, 0.35, 0.3) + rng.normal(0, 0.03, steps),
        entropy=_ramp(steps, 0, steps, 1.2, 0.85) + rng.normal(0, 0.03, steps),
        grad=np.exp(rng.normal(np.log(0.5), 0.3, steps)),
        diversity=0.8 + rng.normal(0, 0.05, steps),
    )


# Where the collapsing stream's curves move: std and entropy fall over 60-90, the reward
# holds until 100 and falls to 0.15 by 125, gradient norm spikes from 120.
STD_FALL, REWARD_FALL, SPIKE = 60, 100, 120


def collapsing(seed: int, steps: int = 160) -> list[dict]:
    rng = np.random.default_rng(seed)
    reward = _ramp(steps, 0, 40, 0.1, 0.7) + _ramp(steps, REWARD_FALL, 125, 0.0, -0.55)
    grad = np.exp(rng.normal(np.log(0.5), 0.3, steps))
    grad[SPIKE:] *= 25
    return _records(
        rng,
        reward=reward + rng.normal(0, 0.05, steps),
        success=np.clip(reward + rng.normal(0, 0.05, steps), 0, 1),
        std=_ramp(steps, STD_FALL, 90, 0.35, 0.05) + rng.normal(0, 0.03, steps),
        entropy=_ramp(steps, STD_FALL, 100, 1.2, 0.3) + rng.normal(0, 0.03, steps),
        grad=grad,
        diversity=_ramp(steps, 70, 110, 0.8, 0.2) + rng.normal(0, 0.05, steps),
    )


def _records(rng, *, reward, success, std, entropy, grad, diversity) -> list[dict]:
    return [
        {
            "step": step,
            "rollout/reward_mean": float(reward[step]),
            "rollout/success": float(success[step]),
            "rollout/reward_std": float(max(std[step], 0.0)),
            "actor/entropy": float(entropy[step]),
            "actor/grad_norm": float(grad[step]),
            "diversity/distinct_reply": float(np.clip(diversity[step], 0, 1)),
        }
        for step in range(len(reward))
    ]
