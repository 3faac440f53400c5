"""The rollout filter: keep the groups that carry learning signal (StarPO-S, RAGEN-2).

A group is the N rollouts of one initial state. The filter scores each group from its
episodes (a *metric*, :data:`METRICS`) and a *strategy* (:data:`RULES`) picks groups by
score, the best first:

- ``reward_variance``, the default metric, is the spread (std) of the group's returns: it
  measures how uncertain the policy still is on that state, and a group whose rollouts all
  score the same carries no learning signal for group-relative estimators and little for PPO.
  ``reward`` and ``reward_sum`` are the mean and sum of its returns; ``entropy`` the mean
  over its episodes of each one's mean token entropy (:func:`sampled_entropy`);
  ``entropy_variance`` their std; ``length`` its mean reply tokens per episode.
- ``top_k`` keeps a share of the groups (StarPO-S: the top 25% by reward std; RAGEN paper,
  section on StarPO-S), rounded up; ``top_k_abs`` a number of them.
- ``top_p`` keeps a share of the signal instead of a share of the groups (RAGEN-2's
  "SNR-aware" filter, its linear top-p rule): with S the summed score of all groups, the
  groups sorted best first are taken while the running sum is below ``p * S - 0.01``; the
  group that reaches it stays in, and a group scoring 0 or less is never taken. So when
  ``p * S <= 0.01`` (no group varies, or hardly) nothing is kept and the step has nothing to
  learn from. ``top_p_softmax`` takes them until their softmax probabilities add up to p.
  ``p = 1`` keeps every group.
- ``min_p`` keeps every group scoring at least p × the best score.

``include_zero=False`` drops the groups scoring 0 before any strategy chooses; ties are
broken by group index (the lower wins), so every choice is deterministic.

A spread is ranked as the population std (divide by N), which orders groups exactly as the
std with Bessel's correction that RAGEN-2 uses, and which is exactly 0 for a constant group;
where the size of a score matters (top_p's 0.01, the softmax) it is taken on RAGEN-2's
scale, the Bessel-corrected std.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ragen import metric_names as names
from ragen.config import FILTER_VALUE_KEYS, AlgoConfig, kept_count

__all__ = [
    "LOSS_SCALINGS",
    "METRICS",
    "RULES",
    "SOFT_EPS",
    "TOP_P_TOLERANCE",
    "ZERO_SCORE",
    "FilterRule",
    "advantage_weights",
    "group_scores",
    "group_std",
    "kept_count",
    "sampled_entropy",
    "select_groups",
]

TOP_P_TOLERANCE = 0.01
"""Subtracted from top_p's target sum of scores (RAGEN-2's selection_eps), on RAGEN-2's scale
(for a spread, the std with Bessel's correction): it absorbs rounding in the running sum, and
it drops a step whose groups hardly vary at all."""

ZERO_SCORE = 1e-10
"""A group score at or below this in size counts as zero (RAGEN-2's cut): returns that differ
only by the rounding of summed per-turn rewards are equal returns. min_p allows the same slack
below its threshold."""

SOFT_EPS = 1e-6
"""Added to the largest group std the soft advantage reweight divides by (RAGEN-2's)."""

METRICS: dict[str, tuple[str, str]] = {
    "reward_variance": ("return", "std"),
    "reward": ("return", "mean"),
    "reward_sum": ("return", "sum"),
    "entropy": ("entropy", "mean"),
    "entropy_variance": ("entropy", "std"),
    "length": ("length", "mean"),
}
"""Each metric (``algo.filter_metric``): the per-episode quantity it reads (``return``,
``entropy`` as :func:`sampled_entropy` gives it, ``length`` in reply tokens) and how a
group's episodes reduce to its score (a key of :data:`REDUCTIONS`)."""


def group_std(group_returns: Tensor) -> Tensor:
    """(G, N) -> (G,) population std (divide by N) of each group's values, computed in
    float64; exactly 0 for a group whose values are all equal (one rollout included). Each
    row is sorted first, so groups holding the same values in any order get bit-identical
    stds (and tie exactly)."""
    x = group_returns.double().sort(dim=1).values
    std = x.std(dim=1, correction=0)
    constant = x.amax(dim=1) == x.amin(dim=1)
    return torch.where(constant, torch.zeros_like(std), std)


REDUCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "std": group_std,
    "mean": lambda values: values.double().mean(dim=1),
    "sum": lambda values: values.double().sum(dim=1),
}
"""How a (G, N) tensor of per-episode values becomes (G,) float64 group scores."""


def group_scores(values: Tensor, reduction: str) -> Tensor:
    """(G, N) per-episode values -> (G,) float64 scores by ``reduction`` (std, mean, sum)."""
    return REDUCTIONS[reduction](values)


def sampled_entropy(logprobs: Tensor, mask: Tensor) -> Tensor:
    """(..., T) log-probs the sampler gave the tokens it drew and (..., T) mask, 1 on sampled
    tokens -> (...) each row's mean token entropy, estimated as minus the mean log-prob of its
    sampled tokens (0 for a row with none).

    -log p(x) of a token x drawn from p has expectation H(p), so the mean over a reply's
    tokens estimates the policy's mean per-token entropy without another forward pass. The
    sampler's log-probs are those of softmax(logits / temperature) before any top-p
    truncation (``Trajectory.logprobs``); with ``rollout.top_p < 1`` the tokens are drawn from
    the nucleus only, so the estimate leaves out the tail's share of the entropy.
    """
    mask = mask.to(logprobs.dtype)
    return -(logprobs * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


# ------------------------------------------------------------------------------ strategies
# Each rule: (scores, candidates, value, scale) -> the groups it keeps. ``scores`` holds
# every group's score, best = largest (the caller negates them to rank the smallest first);
# ``candidates`` the indices it may choose from; ``scale`` turns a score into RAGEN-2's units
# where their size matters (top_p), 1 but for spreads.

Rule = Callable[[Sequence[float], list[int], float, float], list[int]]


def _ranked(scores: Sequence[float], candidates: list[int]) -> list[int]:
    """The candidates best first; a tie goes to the lower index."""
    return sorted(candidates, key=lambda g: (-scores[g], g))


def top_k(scores: Sequence[float], candidates: list[int], value: float, scale: float) -> list[int]:
    """The ``kept_count(G, value)`` best candidates: a share ``value`` of all G groups,
    rounded up, at least one (RAGEN-2 rounds down; the two agree when G × value is whole)."""
    return _ranked(scores, candidates)[: kept_count(len(scores), value)]


def top_k_abs(
    scores: Sequence[float], candidates: list[int], value: float, scale: float
) -> list[int]:
    """The ``int(value)`` best candidates (``value`` >= 1)."""
    if value < 1:
        raise ValueError(f"top_k_abs keeps int(value) groups, so value must be >= 1: {value}")
    return _ranked(scores, candidates)[: int(value)]


def _check_share(value: float, name: str) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must lie in (0, 1], got {value}; 1 keeps every group")


def top_p(scores: Sequence[float], candidates: list[int], value: float, scale: float) -> list[int]:
    """RAGEN-2's linear top-p rule over ``candidates`` (see the module docstring)."""
    _check_share(value, "top_p")
    if value >= 1.0:
        return candidates
    order = _ranked(scores, candidates)
    scaled = [scores[g] * scale for g in order]
    target = value * sum(scaled) - TOP_P_TOLERANCE
    total, count = 0.0, 0
    for score in scaled:
        if total >= target or score <= 0.0:
            break
        total += score
        count += 1
    return order[:count] if total >= target else []


def top_p_softmax(
    scores: Sequence[float], candidates: list[int], value: float, scale: float
) -> list[int]:
    """RAGEN-2's softmax top-p rule: the best candidates until the softmax of their (scaled)
    scores, taken over the candidates, adds up to ``value``; the one that reaches it stays in."""
    _check_share(value, "top_p")
    if value >= 1.0 or not candidates:
        return candidates
    order = _ranked(scores, candidates)
    logits = torch.tensor([scores[g] * scale for g in order], dtype=torch.float64)  # (C,)
    mass = torch.softmax(logits, dim=0).cumsum(dim=0)  # (C,)
    reached = int(torch.searchsorted(mass, torch.tensor([value], dtype=torch.float64)))
    return order[: reached + 1]  # past the end when rounding leaves the total below value


def min_p(scores: Sequence[float], candidates: list[int], value: float, scale: float) -> list[int]:
    """Every candidate scoring at least ``value`` × the best candidate's score."""
    _check_share(value, "min_p")
    if not candidates:
        return []
    threshold = max(scores[g] for g in candidates) * value - ZERO_SCORE
    return [g for g in candidates if scores[g] >= threshold]


RULES: dict[str, Rule] = {
    "top_k": top_k,
    "top_k_abs": top_k_abs,
    "top_p": top_p,
    "top_p_softmax": top_p_softmax,
    "min_p": min_p,
}
"""The strategies by name: ``algo.filter_strategy``'s, top_p split by its mode."""

RANKING: frozenset[str] = frozenset({"top_k", "top_k_abs"})
"""The rules that only rank, so may rank the smallest scores first."""


@dataclass(frozen=True)
class FilterRule:
    """What the filter keeps, as plain values (see :meth:`of` for the config's fields)."""

    strategy: str
    """A key of :data:`RULES`."""
    value: float
    """top_k: share of groups; top_k_abs: their number; top_p and top_p_softmax: share of the
    summed score or of the softmax mass; min_p: share of the best score."""
    metric: str
    """A key of :data:`METRICS`."""
    largest: bool
    """Whether the best scores are the largest (False: the smallest; ranking rules only)."""
    include_zero: bool
    """Whether groups scoring 0 may be kept."""

    @classmethod
    def of(cls, algo: AlgoConfig, ratio: float) -> FilterRule:
        """The rule a run's ``config.algo`` sets (the old spelling ``filter_mode`` read
        through ``algo.filter_choice``); ``ratio`` is top_k's share at this step
        (``algo.filter_ratio``, or ``monitor.rollback_filter_ratio`` after a rollback)."""
        strategy, kind = algo.filter_choice()
        value = ratio if strategy == "top_k" else getattr(algo, FILTER_VALUE_KEYS[strategy])
        if strategy == "top_p" and algo.filter_top_p_mode == "softmax":
            strategy = "top_p_softmax"
        return cls(
            strategy, float(value), algo.filter_metric, kind == "largest", algo.filter_include_zero
        )


def _check_inputs(returns: Tensor, rule: FilterRule, values: Tensor | None) -> None:
    if rule.strategy not in RULES:
        raise ValueError(f"unknown filter strategy {rule.strategy!r}; choose one of {list(RULES)}")
    if rule.metric not in METRICS:
        raise ValueError(f"unknown filter metric {rule.metric!r}; choose one of {list(METRICS)}")
    if not rule.largest and rule.strategy not in RANKING:
        raise ValueError(f"{rule.strategy} keeps the largest scores; rank the smallest with top_k")
    for name, x in (("group_returns", returns), ("values", values)):
        if x is None:
            continue
        if x.dim() != 2 or x.numel() == 0 or x.shape != returns.shape:
            shape = tuple(x.shape)
            raise ValueError(f"{name} must be a non-empty (G, N) tensor, got shape {shape}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} holds NaN or inf; check the environment rewards")


def select_groups(
    returns: Tensor, rule: FilterRule, values: Tensor | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Which groups reach the update.

    Args:
        returns: (G, N) episode returns, one row per group: what the reward metrics score,
            and what the ``filter/std_*`` metrics describe whatever the rule.
        rule: what to keep (see :class:`FilterRule` and the module docstring).
        values: (G, N) the per-episode quantity ``rule.metric`` reads (``METRICS``) when it
            is not the return: entropies, reply lengths; None: ``returns``.

    Returns:
        keep (G,) bool. top_k and top_k_abs keep exactly their count (fewer if
        ``include_zero`` is False and fewer groups score other than 0); top_p and min_p keep
        a number that depends on the scores, top_p possibly none.
        metrics: ``filter/kept_groups``, ``filter/kept_ratio`` (kept / G),
        ``filter/std_mean_kept`` (0 when none is kept), ``filter/std_mean_all`` (mean group
        reward std, see :func:`group_std`), ``filter/std_share_kept`` (the kept groups'
        summed reward std over all groups'; 0 when no group varies),
        ``filter/zero_std_groups`` (groups with all returns equal, of all G),
        ``filter/score_mean_kept`` and ``filter/score_mean_all`` (the rule's scores; a
        spread as the population std), ``filter/empty`` (1 when no group is kept, else 0).
    """
    _check_inputs(returns, rule, values)
    groups, size = returns.shape
    reduction = METRICS[rule.metric][1]
    scores = group_scores(returns if values is None else values, reduction).cpu()  # (G,)
    scale = math.sqrt(size / (size - 1)) if reduction == "std" and size > 1 else 1.0
    zero = scores.abs() <= ZERO_SCORE
    candidates = [g for g in range(groups) if rule.include_zero or not zero[g]]
    ranked = scores if rule.largest else -scores
    chosen = RULES[rule.strategy](ranked.tolist(), candidates, rule.value, scale)
    keep = torch.zeros(groups, dtype=torch.bool)
    keep[chosen] = True
    kept = len(chosen)
    std = group_std(returns).cpu()
    total = float(std.sum())
    metrics = {
        names.KEPT_GROUPS: float(kept),
        names.KEPT_RATIO: kept / groups,
        "filter/std_mean_kept": float(std[keep].mean()) if kept else 0.0,
        "filter/std_mean_all": float(std.mean()),
        "filter/std_share_kept": float(std[keep].sum()) / total if total > 0 else 0.0,
        names.ZERO_STD_GROUPS: float((std <= ZERO_SCORE).sum()),
        "filter/score_mean_kept": float(scores[keep].mean()) if kept else 0.0,
        "filter/score_mean_all": float(scores.mean()),
        "filter/empty": float(kept == 0),
    }
    return keep.to(returns.device), metrics


# --------------------------------------------------------------- advantage weights (RAGEN-2)

LOSS_SCALINGS: dict[str, Callable[[float], float]] = {
    "none": lambda share: 1.0,
    "linear": lambda share: share,
    "sqrt": math.sqrt,
}
"""``algo.filter_loss_scaling``: the factor of the share of groups kept."""


def advantage_weights(
    returns: Tensor, group_ids: Tensor, *, kept_share: float, loss_scaling: str, soft: bool
) -> Tensor:
    """(B,) returns and (B,) group ids of the kept episodes -> (B,) float64 weights RAGEN-2
    multiplies each episode's advantages by after the filter.

    The weight is ``LOSS_SCALINGS[loss_scaling](kept_share)`` (``kept_share`` = kept groups /
    all groups: 1 for none, the share for linear, its root for sqrt), times, when ``soft``
    (the soft advantage reweight), ``σ_g / (max σ + SOFT_EPS)``: σ_g the std with Bessel's
    correction of the returns of the episode's group, the max over the kept groups. Groups
    whose returns vary little then weigh less rather than being dropped.
    """
    scale = LOSS_SCALINGS[loss_scaling](kept_share)
    weights = torch.full(returns.shape, scale, dtype=torch.float64)  # (B,)
    if not soft:
        return weights
    ids, inverse = torch.unique(group_ids.cpu(), return_inverse=True)  # (K,), (B,)
    rows = [returns.cpu()[inverse == k] for k in range(len(ids))]
    sigma = torch.stack(
        [group_std(r[None])[0] * math.sqrt(len(r) / max(1, len(r) - 1)) for r in rows]
    )  # (K,)
    return weights * (sigma / (sigma.max() + SOFT_EPS))[inverse]
