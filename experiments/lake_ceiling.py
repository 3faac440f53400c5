"""The best success any policy can have on the FrozenLake evaluation lakes, by action budget,
beside three baselines: uniformly random play, walking toward the goal, and a careful rule.

    python -m experiments.lake_ceiling [--n 256] [--budgets 5 10 20 50 100] [--turns 5 --per-turn 2]

For each of the ``--n`` evaluation lakes (the seeds `ragen eval` and training evaluations
use), finite-horizon value iteration over the known slippery dynamics gives the highest
probability of reaching the goal within each budget of actions (`envs.experts`); the table
is their mean, the ceiling a FrozenLake success rate is read against; on the corner lakes
(start top-left, goal bottom-right) and on lakes with random ends (``random_ends=true``, as
RAGEN draws them). The floor beside it: a policy that draws each action uniformly, and one
that always steps toward the goal along its larger offset (row first on a tie), blind to
holes, and one that reads only what the ``offsets`` line tells (the goal's offsets, the
holes beside): the move least likely to slip into a hole, then the nearest the goal
(`careful_move`) (`envs.experts.policy_success` on the same table). Then the two experts of
`ragen sft` as they play a rollout: ``--turns`` turns of ``--per-turn`` actions chosen at the
turn's start and played blind (`envs.experts.turn_play_success`): the optimal plan
(``sft.lake_expert=optimal``) and the larger offset's move repeated (``toward``), with the
careful move repeated beside them (what a policy reading the offsets line can reach). Writes
``experiments/results/lake_ceiling.json``. Exact arithmetic on the transition table: no
sampling, so the numbers do not vary between runs or machines.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

from ragen import envs
from ragen.envs.experts import (
    careful_move,
    goal_probabilities,
    lake_plan,
    policy_success,
    turn_play_success,
)
from ragen.envs.frozen_lake import ACTIONS, toward_goal, transition_table
from ragen.train.evaluator import eval_seeds

RESULTS = Path(__file__).parent / "results"
POLICIES = ("optimal", "random", "toward_goal", "careful")


def careful_policy(rows: tuple[str, ...], table: tuple) -> list[list[float]]:
    """Per cell, all probability on `careful_move`'s action."""
    moves = [careful_move(rows, table, cell) for cell in range(len(rows) ** 2)]
    return [[float(action == move) for action in ACTIONS] for move in moves]


def toward_goal_policy(rows: tuple[str, ...]) -> list[list[float]]:
    """Per cell, all probability on `frozen_lake.toward_goal`'s action."""
    size, goal = len(rows), "".join(rows).index("G")
    return [
        [float(action == toward_goal(goal, cell, size)) for action in ACTIONS]
        for cell in range(size * size)
    ]


def ceilings(
    env_name: str, n: int, budgets: list[int], random_ends: bool = False
) -> dict[str, dict[int, float]]:
    """Mean over the evaluation lakes of the success within each budget of the optimal
    policy, of uniform play and of walking toward the goal."""
    env = envs.make(env_name, random_ends=random_ends)
    totals = {who: dict.fromkeys(budgets, 0.0) for who in POLICIES}
    uniform = [[1.0 / len(ACTIONS)] * len(ACTIONS)] * (env.size * env.size)
    for seed in eval_seeds(n):
        env.reset(seed)
        table = transition_table(env.rows, env.slippery)
        values = {
            "optimal": goal_probabilities(table, max(budgets)),
            "random": policy_success(table, uniform, max(budgets)),
            "toward_goal": policy_success(table, toward_goal_policy(env.rows), max(budgets)),
            "careful": policy_success(table, careful_policy(env.rows, table), max(budgets)),
        }
        for who, per_budget in totals.items():
            for budget in budgets:
                per_budget[budget] += values[who][budget][env.state]
    return {
        who: {budget: total / n for budget, total in per_budget.items()}
        for who, per_budget in totals.items()
    }


def _optimal_moves(
    rows: tuple[str, ...], slippery: bool, per_turn: int, cell: int, left: int
) -> tuple[str, ...]:
    return lake_plan(rows, cell, per_turn, left, slippery)[0]


def _toward_moves(rows: tuple[str, ...], per_turn: int, cell: int, left: int) -> list[str]:
    return [toward_goal("".join(rows).index("G"), cell, len(rows))] * per_turn


def _careful_moves(
    rows: tuple[str, ...], table: tuple, per_turn: int, cell: int, left: int
) -> list[str]:
    return [careful_move(rows, table, cell)] * per_turn


def expert_play(
    env_name: str, n: int, turns: int, per_turn: int, options: dict, split: str = "dev"
) -> dict:
    """Mean success over ``n`` evaluation lakes of ``split`` (drawn with the env
    ``options``) of the three experts played turn by turn."""
    env = envs.make(env_name, **options)
    totals = {"optimal": 0.0, "toward": 0.0, "careful": 0.0}
    for seed in eval_seeds(n, split):
        env.reset(seed)
        table = transition_table(env.rows, env.slippery)
        experts = {
            "optimal": partial(_optimal_moves, env.rows, env.slippery, per_turn),
            "toward": partial(_toward_moves, env.rows, per_turn),
            "careful": partial(_careful_moves, env.rows, table, per_turn),
        }
        for who, moves in experts.items():
            totals[who] += turn_play_success(table, env.state, moves, turns, per_turn)
    return {who: total / n for who, total in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="evaluation lakes")
    parser.add_argument("--budgets", type=int, nargs="+", default=[5, 10, 20, 50, 100])
    parser.add_argument("--turns", type=int, default=5, help="turns of the experts' play")
    parser.add_argument("--per-turn", type=int, default=2, help="actions per turn")
    args = parser.parse_args()
    rows = {}
    print(f"{'env':<30}{'policy':<13}" + "".join(f"{b:>9}" for b in args.budgets) + "  (actions)")
    for random_ends in (False, True):
        for env in ("frozen-lake", "frozen-lake-8x8"):
            name = f"{env} random_ends" if random_ends else env
            rows[name] = ceilings(env, args.n, args.budgets, random_ends)
            for who, row in rows[name].items():
                print(f"{name:<30}{who:<13}" + "".join(f"{row[b]:>9.2%}" for b in args.budgets))
    print(
        f"\nthe experts played {args.turns} turns of {args.per_turn} actions, blind within a turn"
    )
    play = {}
    for random_ends in (False, True):
        for env in ("frozen-lake", "frozen-lake-8x8"):
            name = f"{env} random_ends" if random_ends else env
            options = {"random_ends": random_ends}
            play[name] = expert_play(env, args.n, args.turns, args.per_turn, options)
            print(f"{name:<30}" + "".join(f"{who} {v:.2%}  " for who, v in play[name].items()))
    result = {
        "command": "python -m experiments.lake_ceiling "
        + f"--n {args.n} --budgets {' '.join(map(str, args.budgets))}"
        + f" --turns {args.turns} --per-turn {args.per_turn}",
        "eval_lakes": args.n,
        **{
            f"{who}_success": {
                name: {str(b): round(v, 4) for b, v in per_env[who].items()}
                for name, per_env in rows.items()
            }
            for who in POLICIES
        },
        "expert_play": {
            "turns": args.turns,
            "per_turn": args.per_turn,
            **{name: {who: round(v, 4) for who, v in row.items()} for name, row in play.items()},
        },
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "lake_ceiling.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
