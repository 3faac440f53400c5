"""Step metrics computed from a step's trajectories (namespaced ``rollout/…``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ragen.rollout.trajectory import END_REASONS, Trajectory


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def group_reward_std(trajectories: Sequence[Trajectory]) -> float:
    """Mean over groups of the population std of episode returns inside the group: the
    paper's early warning (it falls before the reward does when training collapses)."""
    groups: dict[int, list[float]] = {}
    for t in trajectories:
        groups.setdefault(t.group, []).append(t.total_reward)
    return _mean([statistics.pstdev(g) for g in groups.values()])


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """What the rollout did: reward, success, format, actions, lengths, end reasons."""
    turns = [turn for t in trajectories for turn in t.turns]
    executed = sum(len(turn.actions) for turn in turns)
    proposed = executed + sum(turn.unknown_actions for turn in turns)
    metrics = {
        "rollout/reward_mean": _mean([t.total_reward for t in trajectories]),
        "rollout/reward_std": group_reward_std(trajectories),
        "rollout/success": _mean([float(t.success) for t in trajectories]),
        "rollout/format_ok": _mean([float(turn.format_ok) for turn in turns]),
        "rollout/valid_action_rate": executed / proposed if proposed else 0.0,
        "rollout/actions_per_episode": executed / max(1, len(trajectories)),
        "rollout/turns_per_episode": len(turns) / max(1, len(trajectories)),
        "rollout/reply_tokens": _mean([turn.reply_end - turn.reply_start for turn in turns]),
        "rollout/think_tokens": _mean([turn.think_tokens for turn in turns]),
        "rollout/context_tokens": _mean([len(t.token_ids) for t in trajectories]),
    }
    for reason in END_REASONS:
        share = _mean([float(t.end == reason) for t in trajectories])
        metrics[f"rollout/end_{reason.replace(':', '_')}"] = share
    return metrics
