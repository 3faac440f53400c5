"""Reward-variance buckets of RAGEN-2's gradient reporter.

RAGEN-2 asks where a step's gradient comes from: it ranks the step's groups (the N rollouts
of one initial state) by the spread of their returns, cuts the ranking into quantile buckets,
lowest spread first, and measures each loss term's gradient on each bucket's rows alone. A
group whose rollouts all score the same gives a group-relative estimator no task signal, so
in its bucket the regularisers (entropy, KL) are all that pushes.

The cut is RAGEN-2's: with G groups and K buckets, each bucket holds ``G // K`` groups in
rank order and the last one also takes the remainder (so the highest-variance bucket is the
largest); with fewer groups than buckets each group is a bucket of its own, and the buckets
past the G-th are empty. Ties in spread rank by group id, the lower first, so the cut is
deterministic. The spread is `group_std` (the population std, as ``rollout/reward_std``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ragen.algos.filtering import group_std

__all__ = ["ALL", "bucket_name", "row_buckets", "variance_buckets"]

ALL = "all"
"""The name of the bucket that holds every row."""


def bucket_name(index: int) -> str:
    """``bucket_1`` for the lowest-variance bucket (``index`` 0), and so on up."""
    return f"bucket_{index + 1}"


def variance_buckets(stds: Tensor, buckets: int) -> Tensor:
    """(G,) group reward stds -> (G,) long: each group's bucket, 0 the lowest spread.

    Groups ranked by std ascending, ties by index; rank r goes to bucket
    ``min(r // max(G // K, 1), K - 1)`` for K ``buckets``."""
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    groups = len(stds)
    order = torch.argsort(stds.double(), stable=True)  # (G,) ascending, ties by index
    size = max(groups // buckets, 1)
    ranked = (torch.arange(groups) // size).clamp(max=buckets - 1)  # (G,) bucket by rank
    out = torch.empty(groups, dtype=torch.long)
    out[order] = ranked
    return out


def row_buckets(
    returns: Tensor, group_ids: Tensor, buckets: int, episodes: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Each row's bucket and its group's reward std.

    A group's spread is taken over its episodes, one entry each, also when the rows are
    turn samples: an episode of more turns does not weigh more.

    Args:
        returns: (E,) each episode's return.
        group_ids: (E,) each episode's group; a group's episodes need not be adjacent or of
            one count.
        buckets: K, the number of buckets.
        episodes: (R,) the episode of each row when the rows are turn samples; None when
            each episode is one row (R = E).

    Returns:
        (R,) long bucket of each row's group (`variance_buckets`), and (R,) float64 std of
        each row's group's returns (`group_std`).
    """
    ids, episode_group = torch.unique(group_ids, sorted=True, return_inverse=True)  # (G,), (E,)
    stds = torch.stack(
        [group_std(returns[episode_group == g].double()[None])[0] for g in range(len(ids))]
    )  # (G,)
    row_group = episode_group if episodes is None else episode_group[episodes]  # (R,)
    return variance_buckets(stds, buckets)[row_group], stds[row_group]
