"""GiGPO: group-in-group advantages, an episode term plus a per-turn anchor-state term.

GRPO gives every turn of an episode the same advantage, so a turn that walked into a hole and
a turn that stepped toward the goal share the blame or credit of their episode. GiGPO
(Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training") adds credit per
turn without a critic: the copies of one initial state often pass through the same state
(the same board), and the turns taken from that state form an *anchor group* whose
discounted returns can be compared with each other.

Each turn of an episode is a step sample. For an episode ``b`` of group ``g`` with score
``s_b`` (its total reward) and turns ``t`` with rewards ``r_bt``:

- episode advantage ``A_E(b) = s_b - mean`` (mode mean_norm) or ``(s_b - mean) / (std +
  eps)`` (mean_std_norm), the mean and unbiased std taken over the *step samples* of the
  group, so an episode of more turns weighs more;
- step return ``R_bt = sum_k gamma^k r_b(t+k)``;
- step advantage ``A_S(b, t) = R_bt - mean`` (or normalised as above) over the turns of the
  group whose anchor is the same state;
- ``A(b, t) = A_E(b) + w * A_S(b, t)`` on every reply token of turn ``t``.

A group or anchor group of a single step sample gives 0 (nothing to compare with). GiGPO's
deduction for an invalid action is ragen's ``rollout.format_penalty``, already part of the
turn's reward and of the score. `anchor_ids` turns the anchors' text (the env's history-free
observation of each turn's state) into integer ids, equal text (or, with a similarity
threshold, text as similar as that) giving equal ids within a group.
"""

from __future__ import annotations

from difflib import SequenceMatcher

import torch
from torch import Tensor

ANCHOR_NONE = -1
"""The anchor id of a turn slot an episode does not have (padding of ``(B, M)`` tensors)."""


def discounted_turn_returns(turn_rewards: Tensor, turn_valid: Tensor, gamma: float) -> Tensor:
    """(B, M) ``R_bt = sum_k gamma^k r_b(t+k)`` over an episode's own turns; 0 on padding.

    Args:
        turn_rewards: (B, M) reward of each turn (M: the most turns an episode of the batch
            took).
        turn_valid: (B, M) bool, True on the turns the episode has (a prefix of each row).
        gamma: discount per turn.
    """
    rewards = torch.where(turn_valid, turn_rewards, torch.zeros_like(turn_rewards))
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):  # M is the turn count: a few dozen at most
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return torch.where(turn_valid, returns, torch.zeros_like(returns))


def _relative(values: Tensor, keys: Tensor, norm_by_std: bool, eps: float) -> Tensor:
    """(N,) each value minus the mean of the values sharing its key, divided by their
    unbiased std + eps when ``norm_by_std``; 0 for a key held by one value alone."""
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    n = int(inverse.max()) + 1 if inverse.numel() else 0

    def per_key(x: Tensor) -> Tensor:  # (N,) -> (n,) sums over each key
        return torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, inverse, x)

    count = per_key(torch.ones_like(values))
    centred = values - (per_key(values) / count)[inverse]
    if norm_by_std:
        squares = per_key(centred.square())
        std = (squares / (count - 1).clamp(min=1)).sqrt()
        centred = centred / (std[inverse] + eps)
    return torch.where(count[inverse] > 1, centred, torch.zeros_like(centred))


def gigpo(
    scores: Tensor,
    turn_rewards: Tensor,
    turn_valid: Tensor,
    anchor_ids: Tensor,
    group_ids: Tensor,
    gamma: float,
    step_weight: float,
    norm_by_std: bool,
    eps: float = 1e-6,
) -> Tensor:
    """GiGPO's advantage of every turn (see the module docstring).

    Args:
        scores: (B,) episode scores (total rewards).
        turn_rewards: (B, M) reward of each turn.
        turn_valid: (B, M) bool, True on the turns each episode has.
        anchor_ids: (B, M) long, the anchor state of each turn: turns of one group with the
            same id form an anchor group (ids need not be comparable across groups).
        group_ids: (B,) group of each episode (the copies of one initial state).
        gamma: discount per turn of the step returns.
        step_weight: w, the weight of the step advantage.
        norm_by_std: mean_std_norm (True) or mean_norm (False).
        eps: added to the std before dividing.

    Returns:
        (B, M) advantages (float64, float32 on MPS), 0 on padding.
    """
    work = torch.float32 if turn_rewards.device.type == "mps" else torch.float64
    valid = turn_valid.bool()
    rows, cols = valid.nonzero(as_tuple=True)  # the step samples, episode by episode
    groups = group_ids.to(rows.device)[rows]
    episode = _relative(scores.to(work)[rows], groups[:, None], norm_by_std, eps)
    returns = discounted_turn_returns(turn_rewards.to(work), valid, gamma)[rows, cols]
    keys = torch.stack([groups, anchor_ids[rows, cols].to(groups.dtype)], dim=1)
    step = _relative(returns, keys, norm_by_std, eps)
    out = torch.zeros(valid.shape, dtype=work, device=valid.device)
    out[rows, cols] = episode + step_weight * step
    return out


def anchor_ids(
    anchors: list[list[str]], group_ids: list[int], similarity: float | None = None
) -> Tensor:
    """(B, M) long ids of the anchor texts of each episode's turns (ANCHOR_NONE on padding).

    Within a group, equal texts get equal ids; with ``similarity`` (in (0, 1)) a text joins
    the first earlier cluster of its group whose first text it matches with a difflib ratio
    of at least ``similarity`` (GiGPO's similarity anchors), else starts its own.

    Args:
        anchors: per episode, the anchor text of each of its turns.
        group_ids: (B,) the group of each episode.
        similarity: None for exact matches.
    """
    width = max((len(a) for a in anchors), default=0)
    out = torch.full((len(anchors), width), ANCHOR_NONE, dtype=torch.long)
    clusters: dict[int, list[str]] = {}  # group -> the first text of each of its clusters
    exact: dict[tuple[int, str], int] = {}  # (group, text) -> cluster id, memoised
    for b, (texts, group) in enumerate(zip(anchors, group_ids, strict=True)):
        firsts = clusters.setdefault(group, [])
        for t, text in enumerate(texts):
            found = exact.get((group, text))
            if found is None:
                found = _cluster_of(text, firsts, similarity)
                exact[(group, text)] = found
            out[b, t] = found
    return out


def _cluster_of(text: str, firsts: list[str], similarity: float | None) -> int:
    """The index of the cluster ``text`` joins among ``firsts`` (appended when new)."""
    if similarity is not None:
        for i, first in enumerate(firsts):
            if SequenceMatcher(None, text, first).ratio() >= similarity:
                return i
    firsts.append(text)
    return len(firsts) - 1
