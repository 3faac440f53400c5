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

A group or anchor group of a single step sample gives 0 (nothing to compare with).

The deduction for an invalid action (``p_bt`` <= 0: ragen's ``format`` reward term,
``rollout.format_penalty`` or on a cut reply ``cut_reply_penalty``) is the invalid step's
own, as in verl-agent: its step sample's score is ``s_b - sum_t p_bt + p_bt`` and its return
``R_bt`` is discounted from the rewards without any deduction, then ``p_bt`` is added. So a
penalised turn lowers neither its episode's other turns nor, discounted, the turns before
it. Without ``turn_penalties`` every part of a turn's reward counts as reward.

`anchor_ids` turns the anchors' text (the env's history-free observation of each turn's
state) into integer ids, equal text (or, with a similarity threshold, text as similar as
that) giving equal ids within a group.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

import torch
from torch import Tensor

from ragen import metric_names as names

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
    running = rewards.new_zeros(rewards.shape[0])  # (B,); M may be 0: no turns
    for t in range(rewards.shape[1] - 1, -1, -1):  # M is the turn count: a few dozen at most
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return torch.where(turn_valid, returns, torch.zeros_like(returns))


def _per_key(values: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
    """(N,) sums of ``values`` and counts over the values sharing each one's key, each
    gathered back to its value."""
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    n = int(inverse.max()) + 1 if inverse.numel() else 0

    def per_key(x: Tensor) -> Tensor:  # (N,) -> (n,) sums over each key
        return torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, inverse, x)

    return per_key(values)[inverse], per_key(torch.ones_like(values))[inverse]


def _relative(values: Tensor, keys: Tensor, norm_by_std: bool, eps: float) -> tuple[Tensor, Tensor]:
    """(N,) each value minus the mean of the values sharing its key, divided by their
    unbiased std + eps when ``norm_by_std``; 0 for a key held by one value alone. And (N,)
    the number of values sharing each one's key."""
    total, count = _per_key(values, keys)
    centred = values - total / count
    if norm_by_std:
        squares, _ = _per_key(centred.square(), keys)
        centred = centred / ((squares / (count - 1).clamp(min=1)).sqrt() + eps)
    return torch.where(count > 1, centred, torch.zeros_like(centred)), count


@dataclass(frozen=True)
class Terms:
    """GiGPO's two terms for each step sample (N: the turns of the batch, episode by episode).

    Attributes:
        rows: (N,) the episode (row) of each step sample.
        cols: (N,) its turn within the episode.
        episode: (N,) episode advantage A_E of its episode.
        step: (N,) step advantage A_S, before the weight w.
        anchor_size: (N,) the number of step samples in its anchor group (itself included).
    """

    rows: Tensor
    cols: Tensor
    episode: Tensor
    step: Tensor
    anchor_size: Tensor


def terms(
    scores: Tensor,
    turn_rewards: Tensor,
    turn_valid: Tensor,
    anchor_ids: Tensor,
    group_ids: Tensor,
    gamma: float,
    norm_by_std: bool,
    eps: float = 1e-6,
    turn_penalties: Tensor | None = None,
) -> Terms:
    """The episode and step terms of every step sample; arguments as :func:`gigpo`'s."""
    work = torch.float32 if turn_rewards.device.type == "mps" else torch.float64
    valid = turn_valid.bool()
    rows, cols = valid.nonzero(as_tuple=True)  # the step samples, episode by episode
    groups = group_ids.to(rows.device)[rows]
    rewards = turn_rewards.to(work)
    own = torch.zeros_like(rewards)  # (B, M) each turn's deduction, kept off the others
    if turn_penalties is not None:
        own = torch.where(valid, turn_penalties.to(work), own)
    step_scores = (scores.to(work) - own.sum(1))[rows] + own[rows, cols]
    episode, _ = _relative(step_scores, groups[:, None], norm_by_std, eps)
    returns = discounted_turn_returns(rewards - own, valid, gamma)[rows, cols] + own[rows, cols]
    keys = torch.stack([groups, anchor_ids[rows, cols].to(groups.dtype)], dim=1)
    step, anchor_size = _relative(returns, keys, norm_by_std, eps)
    return Terms(rows, cols, episode, step, anchor_size)


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
    turn_penalties: Tensor | None = None,
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
        turn_penalties: (B, M) the part (<= 0) of each turn's reward, already in
            ``turn_rewards`` and ``scores``, that deducts for an invalid action: it stays on
            its own turn (see the module docstring). None: no deduction is set apart.

    Returns:
        (B, M) advantages (float64, float32 on MPS), 0 on padding.
    """
    t = terms(
        scores,
        turn_rewards,
        turn_valid,
        anchor_ids,
        group_ids,
        gamma,
        norm_by_std,
        eps,
        turn_penalties,
    )
    out = torch.zeros(turn_valid.shape, dtype=t.episode.dtype, device=t.episode.device)
    out[t.rows, t.cols] = t.episode + step_weight * t.step
    return out


def term_metrics(t: Terms, step_weight: float) -> dict[str, float]:
    """What GiGPO's step term had to work with in a batch, over its step samples:

    - ``gigpo/anchored_share``: the share of turns whose anchor group holds another turn
      (a turn alone in its anchor group gets no step term);
    - ``gigpo/turns_per_anchor``: turns per anchor group;
    - ``gigpo/episode_adv_abs`` and ``gigpo/step_adv_abs``: the mean size of the episode
      term A_E and of the weighted step term w * A_S.
    """
    n = t.rows.numel()
    if n == 0:
        return {}
    groups = float((1.0 / t.anchor_size).sum())  # each anchor group's turns add up to 1
    return {
        names.GIGPO_ANCHORED_SHARE: float((t.anchor_size > 1).double().mean()),
        names.GIGPO_TURNS_PER_ANCHOR: n / groups,
        names.GIGPO_EPISODE_ADV: float(t.episode.abs().mean()),
        names.GIGPO_STEP_ADV: float((step_weight * t.step).abs().mean()),
    }


def per_turn(values: list[list[float]]) -> Tensor:
    """(B, M) float64 of each episode's per-turn values (M: the most turns), 0 on padding."""
    width = max((len(v) for v in values), default=0)
    out = torch.zeros(len(values), width, dtype=torch.float64)
    for b, row in enumerate(values):
        out[b, : len(row)] = torch.tensor(row, dtype=torch.float64)
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
