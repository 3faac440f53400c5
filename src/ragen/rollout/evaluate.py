"""Evaluation on fixed seeds: success rate, pass@k, turns, format, and why episodes ended."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ragen.rollout.trajectory import END_REASONS, Trajectory


def eval_seeds(n: int, base: int) -> list[int]:
    """The fixed seeds of an evaluation of ``n`` levels: the same for every model and run."""
    return list(range(base, base + n))


def summarize(trajectories: Sequence[Trajectory]) -> dict:
    """Summary numbers of an evaluation; groups are seeds, copies are the k tries of pass@k.

    ``success`` is the mean over all episodes; ``pass_at_k`` the share of seeds where at
    least one of the k copies succeeded (k = copies per seed).
    """
    if not trajectories:
        raise ValueError("nothing to summarize: no trajectories")
    by_group: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        by_group.setdefault(t.group, []).append(t)
    n = len(trajectories)
    turns = [turn for t in trajectories for turn in t.turns]
    ends = Counter(t.end for t in trajectories)
    return {
        "episodes": n,
        "seeds": len(by_group),
        "k": max(len(g) for g in by_group.values()),
        "success": sum(t.success for t in trajectories) / n,
        "pass_at_k": sum(any(t.success for t in g) for g in by_group.values()) / len(by_group),
        "reward_mean": sum(t.total_reward for t in trajectories) / n,
        "turns_mean": len(turns) / n,
        "actions_mean": sum(len(turn.actions) for turn in turns) / n,
        "format_ok": sum(turn.format_ok for turn in turns) / max(1, len(turns)),
        "reply_tokens_mean": sum(turn.reply_tokens for turn in turns) / max(1, len(turns)),
        "end": {reason: ends.get(reason, 0) / n for reason in END_REASONS},
    }


def format_summary(env: str, summary: dict) -> str:
    """A few human lines for the console."""
    ends = ", ".join(f"{k} {v:.0%}" for k, v in summary["end"].items() if v)
    return (
        f"{env}: success {summary['success']:.2%}  pass@{summary['k']} "
        f"{summary['pass_at_k']:.2%}  reward {summary['reward_mean']:+.3f}  "
        f"({summary['episodes']} episodes, {summary['seeds']} seeds)\n"
        f"  turns {summary['turns_mean']:.2f}  actions {summary['actions_mean']:.2f}  "
        f"format-ok {summary['format_ok']:.2%}  reply tokens {summary['reply_tokens_mean']:.1f}\n"
        f"  ended: {ends}"
    )
