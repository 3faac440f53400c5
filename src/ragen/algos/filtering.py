"""StarPO-S uncertainty filtering: keep the groups whose rollouts disagree the most.

A group is the N rollouts of one initial state. The spread (std) of their returns measures
how uncertain the policy still is on that state; groups where every rollout scores the same
carry no learning signal for group-relative estimators and little for PPO. StarPO-S keeps
the top share of groups by std (RAGEN paper, section on StarPO-S; default 25%).

RAGEN-2 keeps a share of the signal instead of a share of the groups ("SNR-aware", mode
``top_p``, its linear top-p rule): with S the summed std of all groups, the groups sorted by
std, highest first, are taken while the running sum is below ``top_p * S - 0.01``; the group
that reaches it stays in, and a group with zero std is never taken. So when
``top_p * S <= 0.01`` (no group varies, or hardly) nothing is kept and the step has nothing
to learn from. ``top_p = 1`` keeps every group. The 0.01 is in units of the std with
Bessel's correction, which RAGEN-2 ranks by, so it is applied on that scale here; the
choice is otherwise the same under either std. ``include_zero=False`` drops the zero-std
groups before any mode chooses.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ragen import metric_names as names
from ragen.config import kept_count

__all__ = [
    "FILTER_MODES",
    "TOP_P_TOLERANCE",
    "ZERO_STD",
    "group_std",
    "kept_count",
    "select_groups",
]

FILTER_MODES: tuple[str, ...] = ("std", "std_rev", "top_p")

TOP_P_TOLERANCE = 0.01
"""Subtracted from top_p's target sum of stds (RAGEN-2's selection_eps), in units of the std
with Bessel's correction: it absorbs rounding in the running sum, and it drops a step whose
groups hardly vary at all."""

ZERO_STD = 1e-10
"""A group std at or below this counts as zero (RAGEN-2's cut): returns that differ only by
the rounding of summed per-turn rewards are equal returns."""


def group_std(group_returns: Tensor) -> Tensor:
    """(G, N) -> (G,) population std (divide by N) of each group's returns, computed in
    float64; exactly 0 for a group whose returns are all equal (one rollout included). Each
    row is sorted first, so groups holding the same returns in any order get bit-identical
    stds (and tie exactly)."""
    x = group_returns.double().sort(dim=1).values
    std = x.std(dim=1, correction=0)
    constant = x.amax(dim=1) == x.amin(dim=1)
    return torch.where(constant, torch.zeros_like(std), std)


def _top_p(std: list[float], candidates: list[int], top_p: float, group_size: int) -> list[int]:
    """RAGEN-2's linear top-p rule over ``candidates`` (see the module docstring)."""
    if top_p >= 1.0:
        return candidates
    order = sorted(candidates, key=lambda g: (-std[g], g))  # ties: the lower index first
    bessel = math.sqrt(group_size / (group_size - 1)) if group_size > 1 else 1.0
    scores = [std[g] * bessel for g in order]
    target = top_p * sum(scores) - TOP_P_TOLERANCE
    total, count = 0.0, 0
    for score in scores:
        if total >= target or score <= 0.0:
            break
        total += score
        count += 1
    return order[:count] if total >= target else []


def select_groups(
    group_returns: Tensor,
    keep_ratio: float,
    mode: str = "std",
    *,
    top_p: float = 1.0,
    include_zero: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """Which groups reach the update.

    Args:
        group_returns: (G, N) episode returns, one row per group.
        keep_ratio: share of groups kept by ``std`` and ``std_rev``, in (0, 1]; 1 keeps all.
        mode: ``std`` keeps the groups with the highest std (StarPO-S); ``std_rev`` the
            lowest (ablation); ``top_p`` the highest until their summed std reaches
            ``top_p`` of the total (RAGEN-2, see the module docstring).
        top_p: share of the summed std kept by ``top_p``, in (0, 1]; 1 keeps all.
        include_zero: whether groups of zero std may be kept; False drops them in every mode.

    Returns:
        keep (G,) bool. ``std`` and ``std_rev`` keep exactly ``kept_count(G, keep_ratio)``
        groups (fewer if ``include_zero`` is False and fewer groups vary); ``top_p`` keeps a
        number that depends on the stds, possibly none. Ties in std are broken by group index
        (the lower index wins), so the choice is deterministic.
        metrics: ``filter/kept_groups``, ``filter/kept_ratio`` (kept / G),
        ``filter/std_mean_kept`` (0 when none is kept), ``filter/std_mean_all`` (mean group
        std, see :func:`group_std`), ``filter/std_share_kept`` (the kept groups' summed std
        over all groups'; 0 when no group varies), ``filter/zero_std_groups`` (groups with
        all returns equal, of all G), ``filter/empty`` (1 when no group is kept, else 0).
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown filter mode {mode!r}; choose one of {list(FILTER_MODES)}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}; 1 keeps every group")
    if group_returns.dim() != 2 or group_returns.numel() == 0:
        shape = tuple(group_returns.shape)
        raise ValueError(f"group_returns must be a non-empty (G, N) tensor, got shape {shape}")
    if not bool(torch.isfinite(group_returns).all()):
        raise ValueError("group_returns holds NaN or inf; check the environment rewards")
    groups, size = group_returns.shape
    count = kept_count(groups, keep_ratio)
    std = group_std(group_returns).cpu()
    zero = std <= ZERO_STD
    values = std.tolist()
    candidates = [g for g in range(groups) if include_zero or not zero[g]]
    if mode == "top_p":
        chosen = _top_p(values, candidates, top_p, size)
    else:
        sign = -1.0 if mode == "std" else 1.0
        chosen = sorted(candidates, key=lambda g: (sign * values[g], g))[:count]
    keep = torch.zeros(groups, dtype=torch.bool)
    keep[chosen] = True
    kept = len(chosen)
    total = float(std.sum())
    metrics = {
        names.KEPT_GROUPS: float(kept),
        "filter/kept_ratio": kept / groups,
        "filter/std_mean_kept": float(std[keep].mean()) if kept else 0.0,
        "filter/std_mean_all": float(std.mean()),
        "filter/std_share_kept": float(std[keep].sum()) / total if total > 0 else 0.0,
        "filter/zero_std_groups": float(zero.sum()),
        "filter/empty": float(kept == 0),
    }
    return keep.to(group_returns.device), metrics
