"""The best success any policy can have on the FrozenLake evaluation lakes, by action budget.

    python benchmarks/lake_ceiling.py [--n 256] [--budgets 5 10 20 50 100]

For each of the ``--n`` evaluation lakes (the seeds `ragen eval` and training evaluations
use), finite-horizon value iteration over the known slippery dynamics gives the highest
probability of reaching the goal within each budget of actions (`envs.experts`); the table
is their mean, the ceiling a FrozenLake success rate is read against; on the corner lakes
(start top-left, goal bottom-right) and on lakes with random ends (``random_ends=true``, as
RAGEN draws them). Writes
``benchmarks/results/lake_ceiling.json``. Exact arithmetic on the transition table: no
sampling, so the numbers do not vary between runs or machines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragen import envs
from ragen.envs.experts import goal_probabilities
from ragen.envs.frozen_lake import transition_table
from ragen.rollout.loop import EVAL_SEED_BASE
from ragen.train.evaluator import eval_seeds

RESULTS = Path(__file__).parent / "results"


def ceilings(
    env_name: str, n: int, budgets: list[int], random_ends: bool = False
) -> dict[int, float]:
    """Mean over the evaluation lakes of the optimal success within each budget."""
    env = envs.make(env_name, random_ends=random_ends)
    totals = dict.fromkeys(budgets, 0.0)
    for seed in eval_seeds(n, EVAL_SEED_BASE):
        env.reset(seed)
        values = goal_probabilities(transition_table(env.rows, env.slippery), max(budgets))
        for budget in budgets:
            totals[budget] += values[budget][env.state]
    return {budget: total / n for budget, total in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="evaluation lakes")
    parser.add_argument("--budgets", type=int, nargs="+", default=[5, 10, 20, 50, 100])
    args = parser.parse_args()
    rows = {}
    print(f"{'env':<30}" + "".join(f"{b:>9}" for b in args.budgets) + "   (actions)")
    for random_ends in (False, True):
        for env in ("frozen-lake", "frozen-lake-8x8"):
            name = f"{env} random_ends" if random_ends else env
            rows[name] = ceilings(env, args.n, args.budgets, random_ends)
            print(f"{name:<30}" + "".join(f"{rows[name][b]:>9.2%}" for b in args.budgets))
    result = {
        "command": "python benchmarks/lake_ceiling.py "
        + f"--n {args.n} --budgets {' '.join(map(str, args.budgets))}",
        "eval_lakes": args.n,
        "optimal_success": {
            name: {str(b): round(v, 4) for b, v in r.items()} for name, r in rows.items()
        },
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "lake_ceiling.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
