"""Advantage estimators for multi-turn trajectories stored as one token row each.

Shapes: ``B`` episodes, ``T`` token positions (right padded). ``mask`` (B, T) is 1 on the
tokens the policy sampled (the replies) and 0 on prompt, environment, template and padding
tokens. Every token-level estimator treats a row as the sequence of its *sampled* tokens
only: the recursion steps from one sampled token to the previous sampled token, so values
and rewards at masked positions never enter the result, and discounting counts sampled
tokens, not positions. Outputs are 0 at masked positions.

Values follow the usual critic convention: ``values[b, t]`` estimates the return from the
state just before token ``t`` is generated.

All estimators share one keyword call shape (:class:`Estimator`): the tensors, and the
coefficients as one :class:`Coefficients` object built from the config. A trainer picks one by
name through :func:`estimate`: a name of :data:`ESTIMATORS`, or ``package.module:function``
for the user's own, imported only when a run starts (:func:`resolve`). Sequence-level
estimators (grpo, rloo) broadcast their (B,) advantage over each row's sampled tokens;
gigpo (algos/gigpo.py) puts each turn's advantage on that turn's sampled tokens.
:data:`NEEDS_CRITIC` names the ones that use values.
:func:`whiten` rescales a batch's advantages over its sampled tokens; the trainer applies it
after the estimator when configured (RAGEN's code does for gae and bi_level_gae).

Internally everything is computed on a packed layout (sampled tokens moved to the front of
each row, algos/packing.py) with a blocked matrix form of the discounted suffix sum, so no
Python loop runs over T; the tests check each estimator against a plain per-token loop.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, fields
from typing import Protocol

import torch
from torch import Tensor

from ragen.algos.gigpo import gigpo
from ragen.algos.packing import (
    check_shapes,
    discounted_suffix_sum,
    gather,
    out_dtype,
    pack,
    shift_left,
    unpack,
    work_dtype,
)
from ragen.config import NEEDS_CRITIC, AlgoConfig
from ragen.user_code import import_function, is_import_name

__all__ = [
    "ESTIMATORS",
    "NEEDS_CRITIC",
    "Coefficients",
    "Estimator",
    "bi_level_gae",
    "check_name",
    "estimate",
    "gae",
    "grpo",
    "reinforce_pp",
    "resolve",
    "rloo",
    "turn_numbers",
    "whiten",
]


# ------------------------------------------------------------------------------ whitening


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Advantages whitened over the sampled tokens of the whole batch.

    Args:
        values: (B, T) advantages; only entries on sampled tokens count.
        mask: (B, T) 1 on sampled tokens, 0 elsewhere.
        eps: added to the variance under the square root.

    Returns:
        (B, T) ``(x - mean) / sqrt(var + eps)`` on sampled tokens, 0 where mask == 0. With the
        n sampled tokens x_1..x_n: ``mean = sum(x_i) / n`` and
        ``var = sum((x_i - mean)**2) / (n - 1)`` (Bessel's correction). All zeros when fewer
        than two tokens are sampled or all of them hold the same value.

    This is verl's ``masked_whiten(values, mask, shift_mean=True)``, which RAGEN applies to
    its GAE and bi-level GAE advantages before the PPO loss (its ``masked_var`` is unbiased
    by default). Where that formula has no answer (n < 2 gives 0 / 0) or only rounding noise
    (equal values: ~1e-17 times 1e4), the result here is 0: no token is favoured.
    """
    check_shapes(values=values, mask=mask)
    work, out = work_dtype(values.device), out_dtype(values)
    valid = mask != 0
    n = valid.sum()
    zeros = torch.zeros(values.shape, dtype=out, device=values.device)
    if n < 2:
        return zeros
    zero = torch.zeros((), dtype=work, device=values.device)
    x = torch.where(valid, values.to(work), zero)  # masked entries may be anything, even NaN
    hi = torch.where(valid, x, torch.full_like(x, -math.inf)).max()
    lo = torch.where(valid, x, torch.full_like(x, math.inf)).min()
    if hi == lo:
        return zeros
    mean = x.sum() / n
    centred = torch.where(valid, x - mean, zero)
    var = centred.square().sum() / (n - 1)
    return (centred * torch.rsqrt(var + eps)).to(out)


# ------------------------------------------------------------------------------ token level


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the sampled tokens of each row.

    Args:
        rewards: (B, T) per-token rewards; only entries on sampled tokens count.
        values: (B, T) critic values; only entries on sampled tokens count.
        mask: (B, T) 1 on sampled tokens, 0 elsewhere.
        gamma, lam: discount and GAE lambda, per sampled token.

    Returns:
        advantages (B, T) and returns (B, T) = advantages + values, both 0 where mask == 0.

    Definition. Let t_1 < ... < t_K be the sampled positions of a row. With
    ``V_next(t_k) = V(t_{k+1})`` for k < K and ``V_next(t_K) = 0`` (the episode is over after
    its last sampled token: terminal or truncated, nothing is bootstrapped),
    ``delta_k = r(t_k) + gamma * V_next(t_k) - V(t_k)`` and
    ``A(t_k) = delta_k + gamma * lam * A(t_{k+1})`` with ``A(t_{K+1}) = 0``. Environment
    tokens between two replies are skipped, not stepped through: they carry no value, no
    reward and no discount.
    """
    check_shapes(rewards=rewards, values=values, mask=mask)
    work, out = work_dtype(rewards.device), out_dtype(rewards, values)
    idx, valid = pack(mask)
    r = gather(rewards, idx, valid, work)  # (B, K)
    v = gather(values, idx, valid, work)  # (B, K)
    delta = torch.where(valid, r + gamma * shift_left(v) - v, torch.zeros_like(v))
    adv = discounted_suffix_sum(delta, gamma * lam)  # (B, K)
    advantages = unpack(adv, idx, valid, rewards, out)
    returns = unpack(adv + v, idx, valid, rewards, out)
    return advantages, returns


def reinforce_pp(
    rewards: Tensor, mask: Tensor, gamma: float, eps: float = 1e-8
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted return-to-go per sampled token, whitened over the batch.

    Args:
        rewards: (B, T) per-token rewards (only sampled tokens count). A per-token KL penalty,
            if used, is folded into these rewards by the caller beforehand.
        mask: (B, T) 1 on sampled tokens.
        gamma: discount per sampled token.
        eps: added to the variance under the square root (see :func:`whiten`).

    Returns:
        advantages (B, T) and returns (B, T), 0 where mask == 0.

    Definition. ``G(t_k) = sum_{j >= k} gamma**(j - k) r(t_j)`` over the row's sampled tokens
    (env tokens skipped, as in :func:`gae`); returns = G. Advantages are G whitened over all
    sampled tokens of the batch by :func:`whiten` (mean 0, Bessel-corrected variance 1, as
    verl's REINFORCE++ does); all zeros when every sampled token has the same G.
    """
    check_shapes(rewards=rewards, mask=mask)
    work, out = work_dtype(rewards.device), out_dtype(rewards)
    idx, valid = pack(mask)
    ret = discounted_suffix_sum(gather(rewards, idx, valid, work), gamma)  # (B, K)
    adv = whiten(ret, valid, eps)  # (B, K)
    return unpack(adv, idx, valid, rewards, out), unpack(ret, idx, valid, rewards, out)


def _turn_starts(idx: Tensor, valid: Tensor, turn_ids: Tensor | None) -> Tensor:
    """(B, K) bool: packed slot k opens a new turn.

    Without ``turn_ids`` a turn is a maximal run of consecutive sampled positions (replies
    are always separated by environment / template tokens). With ``turn_ids`` (B, T) a turn
    starts wherever the id differs from that of the previous sampled token.
    """
    first = torch.zeros_like(valid)
    first[:, :1] = True
    if turn_ids is None:
        breaks = idx != torch.nn.functional.pad(idx[:, :-1] + 1, (1, 0), value=-1)
    else:
        tid = turn_ids.gather(1, idx)
        breaks = tid != torch.nn.functional.pad(tid[:, :-1], (1, 0))
    return valid & (first | breaks)


def bi_level_gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
    turn_gamma: float,
    turn_lam: float,
    turn_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Bi-level GAE: GAE across turns, then GAE over the tokens inside each turn.

    Args:
        rewards: (B, T) per-token rewards (only sampled tokens count).
        values: (B, T) critic values (only sampled tokens count).
        mask: (B, T) 1 on sampled tokens.
        gamma, lam: token-level discount and lambda inside a turn.
        turn_gamma, turn_lam: turn-level discount (RAGEN: about 0.95) and lambda.
        turn_ids: optional (B, T) integer turn index per token; by default each maximal run
            of consecutive sampled tokens is one turn (one reply).

    Returns:
        advantages (B, T) and returns (B, T) = advantages + values, 0 where mask == 0.

    Definition, per row with turns k = 1..n. Turn k has sampled tokens u_1 < ... < u_m, its
    last token e_k = u_m, its reward ``R_k`` = the sum of the rewards on its sampled tokens
    (both reward placements put a turn's reward on e_k; a reward elsewhere in the turn counts
    as if it sat on e_k) and its value ``W_k = V(e_k)``.

    1. Turn level: ``D_k = R_k + turn_gamma * W_{k+1} - W_k`` with ``W_{n+1} = 0``, and
       ``A^turn_k = D_k + turn_gamma * turn_lam * A^turn_{k+1}`` (``A^turn_{n+1} = 0``).
       The turn target is ``G_k = A^turn_k + W_k``.
    2. Token level inside turn k, seeded with the turn-level advantage at its last token:
       ``A(e_k) = A^turn_k``, and for i < m
       ``A(u_i) = gamma * V(u_{i+1}) - V(u_i) + gamma * lam * A(u_{i+1})``.
       Nothing crosses a turn boundary at token level; the next turn enters only through
       ``G``. With lam = 1 this is ``A(u_i) = gamma**(m - i) * G_k - V(u_i)``: each token is
       bootstrapped from its turn's target.

    With gamma = lam = turn_gamma = turn_lam = 1 and rewards on turn ends only, it equals
    :func:`gae` with gamma = lam = 1.
    """
    check_shapes(rewards=rewards, values=values, mask=mask)
    if turn_ids is not None:
        check_shapes(rewards=rewards, turn_ids=turn_ids)
    work, out = work_dtype(rewards.device), out_dtype(rewards, values)
    idx, valid = pack(mask)
    rows, width = idx.shape
    if width == 0:
        zeros = torch.zeros(rewards.shape, dtype=out, device=rewards.device)
        return zeros, zeros.clone()
    r = gather(rewards, idx, valid, work)  # (B, K)
    v = gather(values, idx, valid, work)  # (B, K)

    # Packed slot -> (turn, offset in turn), then a turn-major layout (B, n, m) per row.
    starts = _turn_starts(idx, valid, turn_ids)  # (B, K)
    turn = starts.long().cumsum(dim=1) - 1  # (B, K) turn index of each slot
    slot = torch.arange(width, device=idx.device).expand(rows, width)
    offset = slot - torch.where(starts, slot, torch.zeros_like(slot)).cummax(dim=1).values
    offset = torch.where(valid, offset, 0)  # padding slots would otherwise extend a turn
    turns, span = int(turn.max()) + 1, int(offset.max()) + 1
    flat = torch.where(valid, turn * span + offset, turns * span)  # invalid -> spill column

    def to_turns(x: Tensor) -> Tensor:  # (B, K) -> (B, n, m)
        grid = torch.zeros(rows, turns * span + 1, dtype=x.dtype, device=x.device)
        return grid.scatter(1, flat, x)[:, :-1].view(rows, turns, span)

    vt, rt = to_turns(v), to_turns(r)  # (B, n, m)
    present = to_turns(valid.to(work)) > 0  # (B, n, m)
    length = present.sum(dim=2)  # (B, n) tokens per turn
    has_turn = length > 0  # (B, n)
    last = (length - 1).clamp(min=0)  # (B, n)
    w = vt.gather(2, last[..., None]).squeeze(2) * has_turn  # (B, n) W_k
    d = torch.where(has_turn, rt.sum(dim=2) + turn_gamma * shift_left(w) - w, 0.0)
    adv_turn = discounted_suffix_sum(d, turn_gamma * turn_lam)  # (B, n) A^turn_k

    inner = present & (torch.arange(span, device=idx.device) < last[..., None])  # not e_k
    delta = torch.where(inner, gamma * shift_left(vt) - vt, 0.0)  # (B, n, m)
    delta = delta.scatter(2, last[..., None], adv_turn[..., None] * has_turn[..., None])
    adv_tok = discounted_suffix_sum(delta, gamma * lam)  # (B, n, m)

    adv = adv_tok.reshape(rows, -1).gather(1, flat.clamp(max=turns * span - 1))  # (B, K)
    advantages = unpack(adv, idx, valid, rewards, out)
    returns = unpack(adv + v, idx, valid, rewards, out)
    return advantages, returns


# --------------------------------------------------------------------------- sequence level


def _groups(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-episode group statistics, each (B,): (group index 0..G-1, group size, group mean,
    constant) where ``constant`` is True when every score of the episode's group is equal."""
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"scores and group_ids must both be (B,), got {tuple(scores.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(n, dtype=scores.dtype, device=scores.device).index_add(
        0, inverse, torch.ones_like(scores)
    )
    total = torch.zeros(n, dtype=scores.dtype, device=scores.device).index_add(0, inverse, scores)
    hi = torch.full((n,), -math.inf, dtype=scores.dtype, device=scores.device)
    lo = torch.full((n,), math.inf, dtype=scores.dtype, device=scores.device)
    hi = hi.scatter_reduce(0, inverse, scores, reduce="amax")
    lo = lo.scatter_reduce(0, inverse, scores, reduce="amin")
    return inverse, count[inverse], (total / count)[inverse], (hi == lo)[inverse]


def grpo(scores: Tensor, group_ids: Tensor, norm_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Group-relative advantages (GRPO).

    Args:
        scores: (B,) episode returns.
        group_ids: (B,) integer group of each episode (episodes of a group share their
            initial state); ids need not be contiguous or sorted.
        norm_by_std: divide the centred score by the group's std.
        eps: added to the std before dividing.

    Returns:
        (B,) ``A_i = (s_i - mean_g) / (std_g + eps)`` (or ``s_i - mean_g``), with mean_g the
        mean and std_g the unbiased std (Bessel's correction, divide by N - 1, as RAGEN and
        verl take it) of the episode's group. A group whose scores are all equal, one-member
        groups included, gets exactly 0.
    """
    work = work_dtype(scores.device)
    s = scores.to(work)
    inverse, count, mean, constant = _groups(s, group_ids)
    centred = s - mean
    if norm_by_std:
        squares = torch.zeros_like(s).index_add(0, inverse, centred.square())[inverse]
        var = squares / (count - 1).clamp(min=1)  # a one-member group is constant: 0 below
        centred = centred / (var.sqrt() + eps)
    return torch.where(constant, torch.zeros_like(s), centred).to(out_dtype(scores))


def rloo(scores: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantages.

    Args:
        scores: (B,) episode returns.
        group_ids: (B,) integer group of each episode.

    Returns:
        (B,) ``A_i = s_i - mean_{j in g, j != i} s_j = N / (N - 1) * (s_i - mean_g)``;
        0 for one-member groups (no baseline to compare with) and constant groups.
    """
    work = work_dtype(scores.device)
    s = scores.to(work)
    _, count, mean, constant = _groups(s, group_ids)
    adv = (s - mean) * count / (count - 1).clamp(min=1)
    return torch.where(constant | (count < 2), torch.zeros_like(s), adv).to(out_dtype(scores))


# ------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Coefficients:
    """The plain numbers the estimators read, passed whole to each one as ``coefs``.

    Each field is the ``algo.`` config field of the same name and :meth:`of` copies them by
    name, so the defaults live once, in ``ragen.config.AlgoConfig``. A new coefficient is a
    config field, a field here, and the estimator that reads it: no signature and no caller
    changes.
    """

    gamma: float
    """Discount per sampled token (gae; bi_level_gae inside a turn; reinforce_pp)."""
    lam: float
    """GAE lambda per sampled token; bi_level_gae uses it between turns too, as RAGEN does."""
    turn_gamma: float
    """Discount between turns (bi_level_gae)."""
    grpo_norm_by_std: bool
    """grpo divides each group-centred score by the group's std (``AlgoConfig.norm_by_std``:
    false under ``algo.dr_grpo``)."""
    gigpo_step_weight: float
    """gigpo's weight w of the step advantage."""
    gigpo_gamma: float
    """gigpo's discount per turn of the step returns."""
    gigpo_mode: str
    """gigpo's normalisation: mean_norm or mean_std_norm."""

    @classmethod
    def of(cls, algo: AlgoConfig) -> Coefficients:
        """The coefficients a run's ``config.algo`` sets (grpo_norm_by_std as it resolves)."""
        values = {f.name: getattr(algo, f.name) for f in fields(cls)}
        return cls(**{**values, "grpo_norm_by_std": algo.norm_by_std()})


class Estimator(Protocol):
    """The call shape of every estimator, ragen's and the user's (all keyword arguments).

    Args:
        rewards: (B, T) float per-token rewards, where ``rollout.reward_placement`` put them
            (on reply tokens only).
        mask: (B, T) float, 1 on the tokens the policy sampled, 0 elsewhere.
        values: (B, T) critic values, or None when the run trains no critic
            (``AlgoConfig.trains_critic``).
        scores: (B,) float episode returns.
        group_ids: (B,) integer group of each episode (the copies of one initial state); the
            ids need not be contiguous. The trainer always passes these two; they are None
            only when a direct :func:`estimate` call leaves them out.
        turn_ids: (B, T) integer turn of each token, or None: a turn is then each maximal run
            of sampled tokens. The trainer passes each reply token's 0-based turn number in
            its episode (-1 on the other tokens).
        anchor_ids: (B, M) long, per turn of each episode the id of the state it acted from
            (equal ids within a group: the same state; -1 past an episode's turns), or None.
            The trainer passes them (see ``gigpo.anchor_ids``); :func:`estimate` passes
            them only to an estimator whose signature takes ``anchor_ids`` or ``**kwargs``,
            so estimators written before it existed still run.
        turn_penalties: (B, M) float, per turn of each episode the part (<= 0) of its reward
            that penalised the reply's form (its ``format`` term: the invalid-action
            deduction; 0 past an episode's turns), already inside ``rewards`` and ``scores``;
            or None. Passed as ``anchor_ids`` is; gigpo keeps it on its own turn.
        coefs: the run's :class:`Coefficients`.

    Returns:
        advantages (B, T) and returns (B, T), both 0 where mask == 0. The returns are the
        critic's targets; an estimator without a critic returns its advantages again.
    """

    def __call__(
        self,
        *,
        rewards: Tensor,
        mask: Tensor,
        values: Tensor | None,
        scores: Tensor | None,
        group_ids: Tensor | None,
        turn_ids: Tensor | None,
        anchor_ids: Tensor | None,
        turn_penalties: Tensor | None,
        coefs: Coefficients,
    ) -> tuple[Tensor, Tensor]: ...


def _need(name: str, **inputs: Tensor | None) -> None:
    missing = [key for key, value in inputs.items() if value is None]
    if missing:
        raise ValueError(f"estimator {name!r} needs {', '.join(missing)}; pass them to estimate()")


def _broadcast(adv: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B,) -> (B, T) over the sampled tokens; returns = advantages (no critic)."""
    out = torch.where(mask != 0, adv[:, None], torch.zeros((), dtype=adv.dtype))
    return out, out.clone()


def _est_gae(*, rewards, values, mask, coefs, **_) -> tuple[Tensor, Tensor]:
    _need("gae", values=values)
    return gae(rewards, values, mask, coefs.gamma, coefs.lam)


def _est_bi_level(*, rewards, values, mask, turn_ids, coefs, **_) -> tuple[Tensor, Tensor]:
    _need("bi_level_gae", values=values)
    c = coefs
    return bi_level_gae(rewards, values, mask, c.gamma, c.lam, c.turn_gamma, c.lam, turn_ids)


def _est_grpo(*, mask, scores, group_ids, coefs, **_) -> tuple[Tensor, Tensor]:
    _need("grpo", scores=scores, group_ids=group_ids)
    return _broadcast(grpo(scores, group_ids, coefs.grpo_norm_by_std), mask)


def _est_rloo(*, mask, scores, group_ids, **_) -> tuple[Tensor, Tensor]:
    _need("rloo", scores=scores, group_ids=group_ids)
    return _broadcast(rloo(scores, group_ids), mask)


def _est_reinforce_pp(*, rewards, mask, coefs, **_) -> tuple[Tensor, Tensor]:
    return reinforce_pp(rewards, mask, coefs.gamma)


def turn_numbers(mask: Tensor, turn_ids: Tensor | None = None) -> Tensor:
    """(B, T) long: the 0-based turn of each sampled token in its row, -1 elsewhere.

    With ``turn_ids`` these are the ids themselves (the trainer's turn numbers); without, the
    turns are counted as in :func:`_turn_starts` (each maximal run of sampled tokens).
    """
    sampled = mask != 0
    if turn_ids is not None:
        return torch.where(sampled, turn_ids.long(), torch.full_like(turn_ids, -1).long())
    idx, valid = pack(mask)
    number = _turn_starts(idx, valid, None).long().cumsum(1) - 1
    out = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
    return out.scatter(1, idx, torch.where(valid, number, torch.full_like(number, -1)))


def _est_gigpo(
    *, rewards, mask, scores, group_ids, turn_ids, anchor_ids, coefs, turn_penalties=None, **_
) -> tuple[Tensor, Tensor]:
    _need("gigpo", scores=scores, group_ids=group_ids, anchor_ids=anchor_ids)
    turns = turn_numbers(mask, turn_ids)
    width = int(turns.max()) + 1 if turns.numel() else 0
    for name, per_turn_input in (("anchor_ids", anchor_ids), ("turn_penalties", turn_penalties)):
        if per_turn_input is None:
            continue
        if per_turn_input.shape[0] != mask.shape[0] or per_turn_input.shape[1] < width:
            raise ValueError(
                f"{name} {tuple(per_turn_input.shape)} must hold one value per turn of each "
                f"row ({mask.shape[0]} rows, up to {width} turns)"
            )
    if width == 0:  # no row holds a sampled token: nothing to credit
        zeros = torch.zeros(mask.shape, dtype=out_dtype(rewards, scores), device=mask.device)
        return zeros, zeros.clone()
    sampled = turns >= 0
    slot = turns.clamp(min=0)
    work = work_dtype(mask.device)

    def per_turn(x: Tensor) -> Tensor:  # (B, T) summed over each turn's tokens -> (B, width)
        zero = torch.zeros((), dtype=work, device=mask.device)
        placed = torch.where(sampled, x.to(work), zero)
        return torch.zeros(len(mask), width, dtype=work, device=mask.device).scatter_add(
            1, slot, placed
        )

    turn_adv = gigpo(
        scores,
        per_turn(rewards),
        per_turn(torch.ones_like(mask, dtype=work)) > 0,
        anchor_ids[:, :width],
        group_ids,
        coefs.gigpo_gamma,
        coefs.gigpo_step_weight,
        norm_by_std=coefs.gigpo_mode == "mean_std_norm",
        turn_penalties=None if turn_penalties is None else turn_penalties[:, :width],
    )
    zero = torch.zeros((), dtype=turn_adv.dtype, device=mask.device)
    adv = torch.where(sampled, turn_adv.gather(1, slot), zero).to(out_dtype(rewards, scores))
    return adv, adv.clone()


ESTIMATORS: dict[str, Estimator] = {
    "gae": _est_gae,
    "grpo": _est_grpo,
    "bi_level_gae": _est_bi_level,
    "rloo": _est_rloo,
    "reinforce_pp": _est_reinforce_pp,
    "gigpo": _est_gigpo,
}
"""ragen's estimators by name, each called as :class:`Estimator` describes."""


def check_name(name: str) -> None:
    """Raise ValueError unless ``name`` is one of :data:`ESTIMATORS` or has the shape
    ``package.module:function``; nothing is imported, so checking a config runs no user code."""
    if name not in ESTIMATORS and not is_import_name(name):
        raise ValueError(
            f"unknown estimator {name!r}: use one of {', '.join(ESTIMATORS)}, or "
            "module:function for your own (docs/guides/adding-an-estimator.md)"
        )


def resolve(name: str) -> Estimator:
    """The estimator a config name stands for: one of :data:`ESTIMATORS`, or
    ``package.module:function``, imported here (user code: call this when a run starts).

    Raises ValueError naming the fix when the name names nothing callable.
    """
    check_name(name)
    if name in ESTIMATORS:
        return ESTIMATORS[name]
    return import_function(name, "estimator")  # its call shape is the user's promise


def estimate(
    name: str,
    *,
    rewards: Tensor,
    mask: Tensor,
    coefs: Coefficients,
    values: Tensor | None = None,
    scores: Tensor | None = None,
    group_ids: Tensor | None = None,
    turn_ids: Tensor | None = None,
    anchor_ids: Tensor | None = None,
    turn_penalties: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Advantages and returns by estimator name, one call shape for all.

    Args:
        name: a key of :data:`ESTIMATORS`, or ``package.module:function`` (see :func:`resolve`).
        rewards, mask: (B, T) per-token rewards and the sampled-token mask.
        coefs: the coefficients (:meth:`Coefficients.of` a config's ``algo``).
        values: (B, T) critic values (gae, bi_level_gae).
        scores, group_ids: (B,) episode returns and groups (grpo, rloo, gigpo).
        turn_ids: optional (B, T) turn index per token (bi_level_gae, gigpo).
        anchor_ids: (B, M) anchor state id per turn (gigpo).
        turn_penalties: (B, M) the invalid-action deduction inside each turn's reward (gigpo).

    Returns:
        advantages (B, T) and returns (B, T), 0 where mask == 0 (see :class:`Estimator`).
        Sequence-level estimators put their (B,) advantage on every sampled token of the row,
        and returns = advantages.

    Raises ValueError when an estimator returns anything but two tensors of ``mask``'s
    shape: the update would otherwise fail far from the estimator that is wrong.
    """
    function = resolve(name)
    # inputs added after the call shape was first published
    later = {"anchor_ids": anchor_ids, "turn_penalties": turn_penalties}
    result = function(
        rewards=rewards,
        mask=mask,
        values=values,
        scores=scores,
        group_ids=group_ids,
        turn_ids=turn_ids,
        coefs=coefs,
        **{key: value for key, value in later.items() if _takes(function, key)},
    )
    pair = result if isinstance(result, tuple | list) else (result,)
    shapes = [tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__ for t in pair]
    if len(shapes) != 2 or any(shape != tuple(mask.shape) for shape in shapes):
        raise ValueError(
            f"estimator {name!r} returned {shapes}: it must return (advantages, returns), two "
            f"tensors of the mask's shape {tuple(mask.shape)}"
        )
    return result


def _takes(function: Estimator, keyword: str) -> bool:
    """Whether ``function`` accepts the keyword argument ``keyword`` (named or **kwargs)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a callable without a readable signature: pass it all
        return True
    return keyword in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
