"""Advantage estimators written outside ragen: the worked examples of
docs/guides/adding-an-estimator.md.

    ragen train bandit algo.estimator=my_estimators:median_baseline      # this folder on PYTHONPATH
    ragen train bandit algo.estimator=my_estimators:return_minus_value algo.critic=true

Each is called as ``ragen.algos.advantages.Estimator`` describes: keyword arguments only,
the (B, T) and (B,) tensors of the kept batch and the run's ``Coefficients``; it returns
(advantages, returns), both (B, T) and 0 where ``mask`` is 0. ``**_`` takes the arguments an
estimator does not read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ragen.algos.advantages import Coefficients

STD_EPS = 1e-6  # added to a group's std before dividing, as ragen's grpo does


def median_baseline(
    *, mask: Tensor, scores: Tensor, group_ids: Tensor, coefs: Coefficients, **_
) -> tuple[Tensor, Tensor]:
    """GRPO with the group's median as the baseline instead of its mean.

    Args:
        mask: (B, T) 1 on sampled tokens.
        scores: (B,) episode returns.
        group_ids: (B,) group of each episode (ids need not be contiguous: the filter keeps
            some groups and drops others).
        coefs: reads ``grpo_norm_by_std`` (config ``algo.grpo_norm_by_std``).

    Returns:
        advantages (B, T): ``A_i = s_i - median_g`` on every sampled token of episode i, divided
        by ``std_g + 1e-6`` (the group's unbiased std, as ``grpo`` takes it) when
        ``grpo_norm_by_std``; returns = advantages (no critic). 0 where mask == 0.

    Why: with a mean baseline, one lucky episode in a group of failures gives every failure a
    negative advantage; the median leaves the typical episode at 0 and credits only the ones
    that did better or worse than it. The median of an even group is the mean of its two
    middle scores. A group whose scores are all equal, one-member groups included, gets 0.
    """
    adv = torch.zeros_like(scores, dtype=torch.float64)  # (B,)
    for group in torch.unique(group_ids):  # a step has few groups: a loop reads plainest
        member = group_ids == group
        s = scores[member].double()
        centred = s - torch.quantile(s, 0.5)  # quantile interpolates: the true median
        if coefs.grpo_norm_by_std:
            centred = centred / (s.std() + STD_EPS)
        adv[member] = centred
    out = torch.where(mask != 0, adv[:, None], 0.0).to(torch.float32)  # (B, T)
    return out, out.clone()


def return_minus_value(
    *, mask: Tensor, values: Tensor | None, scores: Tensor, **_
) -> tuple[Tensor, Tensor]:
    """The episode's return less the critic's value, on every sampled token.

    Args:
        mask: (B, T) 1 on sampled tokens.
        values: (B, T) critic values: the run needs ``algo.critic=true``.
        scores: (B,) episode returns.

    Returns:
        advantages (B, T) ``A(t) = s - V(t)`` and returns (B, T) ``= s`` (the critic learns to
        predict the episode's return from every token), both 0 where mask == 0.

    With the reward on the episode's last token (``rollout.reward_placement=last_token``,
    the default) this is ragen's ``gae`` with gamma = lam = 1.
    """
    if values is None:
        raise ValueError(
            "my_estimators:return_minus_value reads the critic's values: set algo.critic=true"
        )
    sampled = mask != 0
    returns = torch.where(sampled, scores[:, None].to(values.dtype), 0.0)  # (B, T)
    return torch.where(sampled, returns - values, 0.0), returns
