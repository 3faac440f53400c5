"""StarPO-S uncertainty filtering: keep the groups whose rollouts disagree the most.

A group is the N rollouts of one initial state. The spread (std) of their returns measures
how uncertain the policy still is on that state; groups where every rollout scores the same
carry no learning signal for group-relative estimators and little for PPO. StarPO-S keeps
the top share of groups by std (RAGEN paper, section on StarPO-S; default 25%).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["FILTER_MODES", "group_std", "kept_count", "select_groups"]

FILTER_MODES: tuple[str, ...] = ("std", "std_rev")


def kept_count(groups: int, keep_ratio: float) -> int:
    """Groups kept out of ``groups``: ``max(1, ceil(groups * keep_ratio - 1e-9))``.

    The same rule as ``ragen.config.kept_groups`` (the 1e-9 keeps 0.25 * 8 at 2, not 3, when
    the product rounds up in floating point).
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must lie in (0, 1], got {keep_ratio}; 1 keeps every group")
    return min(groups, max(1, math.ceil(groups * keep_ratio - 1e-9)))


def group_std(group_returns: Tensor) -> Tensor:
    """(G, N) -> (G,) population std (divide by N) of each group's returns, computed in
    float64; exactly 0 for a group whose returns are all equal (one rollout included). Each
    row is sorted first, so groups holding the same returns in any order get bit-identical
    stds (and tie exactly)."""
    x = group_returns.double().sort(dim=1).values
    std = x.std(dim=1, correction=0)
    constant = x.amax(dim=1) == x.amin(dim=1)
    return torch.where(constant, torch.zeros_like(std), std)


def select_groups(
    group_returns: Tensor, keep_ratio: float, mode: str = "std"
) -> tuple[Tensor, dict[str, float]]:
    """Which groups reach the update.

    Args:
        group_returns: (G, N) episode returns, one row per group.
        keep_ratio: share of groups kept, in (0, 1]; 1 keeps all.
        mode: ``std`` keeps the groups with the highest std (StarPO-S); ``std_rev`` the
            lowest (ablation).

    Returns:
        keep (G,) bool with exactly ``kept_count(G, keep_ratio)`` True entries; ties in std
        are broken by group index (the lower index wins), so the choice is deterministic.
        metrics: ``filter/kept_groups``, ``filter/kept_ratio`` (kept / G),
        ``filter/std_mean_kept``, ``filter/std_mean_all`` (mean group std, see
        :func:`group_std`), ``filter/zero_std_groups`` (groups with all returns equal, of all
        G).
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown filter mode {mode!r}; choose one of {list(FILTER_MODES)}")
    if group_returns.dim() != 2 or group_returns.numel() == 0:
        shape = tuple(group_returns.shape)
        raise ValueError(f"group_returns must be a non-empty (G, N) tensor, got shape {shape}")
    if not bool(torch.isfinite(group_returns).all()):
        raise ValueError("group_returns holds NaN or inf; check the environment rewards")
    groups = group_returns.shape[0]
    count = kept_count(groups, keep_ratio)
    std = group_std(group_returns).cpu()
    sign = -1.0 if mode == "std" else 1.0
    order = sorted(range(groups), key=lambda g: (sign * float(std[g]), g))
    keep = torch.zeros(groups, dtype=torch.bool)
    keep[order[:count]] = True
    metrics = {
        "filter/kept_groups": float(count),
        "filter/kept_ratio": count / groups,
        "filter/std_mean_kept": float(std[keep].mean()),
        "filter/std_mean_all": float(std.mean()),
        "filter/zero_std_groups": float((std == 0).sum()),
    }
    return keep.to(group_returns.device), metrics
