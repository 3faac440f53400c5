"""Step metrics computed from a step's trajectories: what the rollout did (``rollout/…``)
how varied the replies are (``diversity/…``, ``think/…``), and what GiGPO's per-turn credit had
to compare (``gigpo/…``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import cache

import torch

from ragen import metric_names as names
from ragen.agent.parsing import parse_reply
from ragen.agent.prompts import example_reply
from ragen.algos import gigpo
from ragen.algos.filtering import group_std
from ragen.rollout.trajectory import END_REASONS, Trajectory


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def group_reward_std(trajectories: Sequence[Trajectory]) -> float:
    """Mean over groups of the in-group return std the filter ranks groups by
    (`ragen.algos.filtering.group_std`): the paper's early warning (it falls before the
    reward does when training collapses)."""
    groups: dict[int, list[float]] = {}
    for t in trajectories:
        groups.setdefault(t.group, []).append(t.total_reward)
    return _mean([float(group_std(torch.tensor([g]))[0]) for g in groups.values()])


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """What the rollout did: reward, success, format, actions, lengths, end reasons."""
    turns = [turn for t in trajectories for turn in t.turns]
    executed = sum(len(turn.actions) for turn in turns)
    proposed = executed + sum(turn.unknown_actions for turn in turns)
    metrics = {
        names.REWARD_MEAN: _mean([t.total_reward for t in trajectories]),
        names.REWARD_STD: group_reward_std(trajectories),
        names.SUCCESS: _mean([float(t.success) for t in trajectories]),
        # what the success is a share of: the collapse detector tests it as counts
        names.EPISODES: float(len(trajectories)),
        names.FORMAT_OK: _mean([float(turn.format_ok) for turn in turns]),
        "rollout/valid_action_rate": executed / proposed if proposed else 0.0,
        "rollout/actions_per_episode": executed / max(1, len(trajectories)),
        names.TURNS_PER_EPISODE: len(turns) / max(1, len(trajectories)),
        names.REPLY_TOKENS: _mean([turn.reply_tokens for turn in turns]),
        names.THINK_TOKENS: _mean([turn.think_tokens for turn in turns]),
        names.CONTEXT_TOKENS: _mean([t.context_tokens for t in trajectories]),
    }
    for reason in END_REASONS:
        ended = [t.total_reward for t in trajectories if t.end == reason]
        key = reason.replace(":", "_")
        metrics[f"rollout/end_{key}"] = len(ended) / max(1, len(trajectories))
        # What ending this way pays: when a cut reply or the turn budget pays more than
        # playing on, the policy learns to end episodes early instead of solving them.
        if ended:
            metrics[f"rollout/return_end_{key}"] = _mean(ended)
    terms = dict.fromkeys(name for turn in turns for name in turn.terms)
    for name in terms:  # each reward term's share of the episode return, per episode
        total = sum(turn.terms.get(name, 0.0) for turn in turns)
        metrics[f"reward/{name}"] = total / max(1, len(trajectories))
    return metrics


# ---------------------------------------------------------------------------- diversity
#
# The Echo Trap (RAGEN, finding 2): under reward feedback the replies of a group converge to
# one phrasing. These counts see that in the text itself, without a model.

_WORDS = re.compile(r"\w+|[^\w\s]")
DIVERSITY_METRICS = (
    names.DISTINCT_REPLY,
    names.DISTINCT_THINK,
    names.THINK_TOKENS_MEAN,
    names.THINK_EMPTY_SHARE,
    names.THINK_TEMPLATE_SHARE,
    names.ACTION_TEMPLATE_SHARE,
)


def _normalise(text: str) -> str:
    """Lower-case with runs of blanks folded to one space: 'Up ' and 'up' are one reply."""
    return " ".join(text.lower().split())


def _by_group(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group, []).append(t)
    return list(groups.values())


def distinct_ratio(texts: Sequence[str]) -> float:
    """Distinct texts / texts after :func:`_normalise` (1.0 all differ; 1/n all equal; 0.0
    for no texts)."""
    if not texts:
        return 0.0
    return len({_normalise(t) for t in texts}) / len(texts)


def distinct_ngram_ratio(texts: Sequence[str], n: int = 2) -> float:
    """Distinct-n (Li et al., 2016): distinct word n-grams / all word n-grams over ``texts``.

    Words are lower-cased ``\\w+`` runs and single punctuation marks; n-grams never span two
    texts. Returns 0.0 when no text has n words (nothing to count).
    """
    seen: set[tuple[str, ...]] = set()
    total = 0
    for text in texts:
        words = _WORDS.findall(text.lower())
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        seen.update(grams)
        total += len(grams)
    return len(seen) / total if total else 0.0


@cache
def example_thought() -> str:
    """The think text of the example reply that the prompt shows the agent."""
    actions = ("Up", "Down")
    return parse_reply(example_reply(actions, 2), actions, 2).think


def template_thinks(
    trajectories: Sequence[Trajectory],
    *,
    min_groups: int = 3,
    examples: Sequence[str] | None = None,
) -> set[str]:
    """Normalised think texts that look copied rather than written for the state at hand.

    A think is a template when it equals an example thought (default: the prompt's own
    example), or when the identical text appears in at least ``min_groups`` different groups:
    groups start from different states, so one text fitting them all says nothing about any.
    """
    where: dict[str, set[int]] = {}
    for t in trajectories:
        for turn in t.turns:
            text = _normalise(turn.think)
            if text:
                where.setdefault(text, set()).add(t.group)
    copied = {text for text, groups in where.items() if len(groups) >= min_groups}
    copies = [example_thought()] if examples is None else examples
    return copied | ({_normalise(e) for e in copies} & set(where))


def action_template(
    episodes: Iterable[tuple[Sequence[str], bool]],
) -> tuple[tuple[str, ...], float]:
    """The policy's most frequent action sequence and how much of its play it is.

    episodes: (actions, success) per episode. The template is the most frequent sequence
    among the episodes that ended without success (mostly at the end of their budget, so a
    full sequence, not one cut short by a win); its share
    counts every episode whose actions are it or a prefix of it (a success ends an episode
    early), an episode that made no move only when the template is no move too (it plays
    no sequence at all). Near 1 on a multi-turn game, the policy plays the same moves
    whatever the level: the Echo Trap, however high its success. ((), 0.0) when every
    episode succeeded.
    """
    played = [(tuple(actions), success) for actions, success in episodes]
    failed = Counter(actions for actions, success in played if not success)
    if not failed:
        return (), 0.0
    template = failed.most_common(1)[0][0]
    follows = sum(
        actions == template or (len(actions) > 0 and actions == template[: len(actions)])
        for actions, _ in played
    )
    return template, follows / len(played)


def diversity_metrics(
    trajectories: Sequence[Trajectory], *, template_min_groups: int = 3
) -> dict[str, float]:
    """Reply and think diversity of one step's episodes (every turn of every episode).

    - ``diversity/distinct_reply``: per group, distinct reply texts / replies, then the mean
      over groups (1.0: no two replies of a group alike; 1/n: one reply repeated);
    - ``diversity/distinct_2gram_think``: per group, distinct-2 of the think texts, then the
      mean over groups (groups without a two-word think are left out);
    - ``think/tokens_mean``: mean think length in tokens per reply;
    - ``think/empty_share``: share of replies whose think is empty (or missing);
    - ``think/template_share``: share of replies whose think is a template
      (:func:`template_thinks`);
    - ``diversity/action_template_share``: share of the step's episodes that play its most
      frequent failed action sequence or a prefix of it (:func:`action_template`; across
      groups, so near 1 means the same moves on different levels).
    All are 0.0 for a step without replies.
    """
    turns = [turn for t in trajectories for turn in t.turns]
    if not turns:
        return dict.fromkeys(DIVERSITY_METRICS, 0.0)
    groups = _by_group(trajectories)
    replies = [distinct_ratio([u.reply for t in g for u in t.turns]) for g in groups]
    thinks = [[u.think for t in g for u in t.turns] for g in groups]
    bigrams = [distinct_ngram_ratio(texts, 2) for texts in thinks if _has_ngram(texts, 2)]
    templates = template_thinks(trajectories, min_groups=template_min_groups)
    return {
        names.DISTINCT_REPLY: _mean([r for r in replies if r > 0]),
        names.DISTINCT_THINK: _mean(bigrams),
        names.THINK_TOKENS_MEAN: _mean([u.think_tokens for u in turns]),
        names.THINK_EMPTY_SHARE: _mean([float(not u.think.strip()) for u in turns]),
        names.THINK_TEMPLATE_SHARE: _mean([float(_normalise(u.think) in templates) for u in turns]),
        names.ACTION_TEMPLATE_SHARE: action_template(
            ([a for u in t.turns for a in u.actions], t.success) for t in trajectories
        )[1],
    }


def _has_ngram(texts: Sequence[str], n: int) -> bool:
    return any(len(_WORDS.findall(t)) >= n for t in texts)


# ---------------------------------------------------------------------------- credit


def gigpo_turn_inputs(
    trajectories: Sequence[Trajectory], similarity: float | None = None
) -> dict[str, torch.Tensor]:
    """GiGPO's per-turn inputs of ``trajectories``, each (B, M): ``anchor_ids`` (the turns'
    anchor texts grouped within each episode group, `ragen.algos.gigpo.anchor_ids`, with
    ``algo.gigpo_similarity``) and ``turn_penalties`` (each turn's format term)."""
    anchors = [[u.anchor_key for u in t.turns] for t in trajectories]
    groups = [t.group for t in trajectories]
    return {
        "anchor_ids": gigpo.anchor_ids(anchors, groups, similarity),
        "turn_penalties": gigpo.per_turn([[u.penalty for u in t.turns] for t in trajectories]),
    }


def credit_metrics(
    trajectories: Sequence[Trajectory],
    *,
    gamma: float,
    step_weight: float,
    norm_by_std: bool,
    similarity: float | None = None,
    turn_inputs: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, float]:
    """GiGPO's anchor groups and the size of its two terms over ``trajectories`` (the
    ``gigpo/…`` metrics of `ragen.algos.gigpo.term_metrics`): whether the per-turn credit
    had turns to compare. Arguments as ``algo.gigpo_gamma``, ``gigpo_step_weight``,
    ``gigpo_mode == "mean_std_norm"`` and ``gigpo_similarity``; ``turn_inputs``: the
    trajectories' ``anchor_ids`` and ``turn_penalties``, (B, M) each, when the trainer has
    built them for the estimator (``Trainer.turn_inputs``), else ``gigpo_turn_inputs``'s."""
    if not any(t.turns for t in trajectories):
        return {}
    rewards = gigpo.per_turn([[u.reward for u in t.turns] for t in trajectories])
    width = rewards.shape[1]
    valid = torch.tensor([[n < len(t.turns) for n in range(width)] for t in trajectories])
    if turn_inputs is None:
        turn_inputs = gigpo_turn_inputs(trajectories, similarity)
    found = gigpo.terms(
        torch.tensor([t.total_reward for t in trajectories], dtype=torch.float64),
        rewards,
        valid,
        turn_inputs["anchor_ids"].cpu(),
        torch.tensor([t.group for t in trajectories]),
        gamma,
        norm_by_std,
        turn_penalties=turn_inputs["turn_penalties"].cpu(),
    )
    return gigpo.term_metrics(found, step_weight)
