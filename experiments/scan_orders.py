"""How often the careful rule reaches the goal under each tie-break a scan thought can state.

    python -m experiments.scan_orders [--n 256] [--split dev] [--turns 10]

`careful_move` breaks ties between equally careful moves toward the goal along its larger
offset. The scan thought (`sft.lake_expert=scan`) lists the four sides in one fixed order
and names the first side of the worst kind, so its tie goes to the move opposite the side
listed first (`careful_move`'s ``scan``). For each of the 24 orders, and for the larger
offset's tie beside them, the exact probability of reaching the goal within ``--turns``
turns of one action (`envs.experts.turn_play_success`), averaged over ``--n`` evaluation
lakes of ``--split`` with random ends, as the FrozenLake speedrun plays them. The order the
scan expert uses (`envs.experts.SCAN_ORDER`) was picked from this table on the dev lakes.
Writes ``experiments/results/scan_orders.json``; exact arithmetic, no sampling.
"""

from __future__ import annotations

import argparse
import itertools
import json
from functools import partial
from pathlib import Path

from ragen import envs
from ragen.envs.experts import careful_move, turn_play_success
from ragen.envs.frozen_lake import ACTIONS, transition_table
from ragen.train.evaluator import eval_seeds

RESULTS = Path(__file__).parent / "results"
LARGER_OFFSET = "larger offset"
"""The row of `careful_move`'s own tie-break, toward the goal along its larger offset."""


def _repeat(moves: list[str], cell: int, actions_left: int) -> list[str]:
    """One turn of the move ``moves`` gives ``cell``."""
    return [moves[cell]]


def success_by_order(n: int, split: str, turns: int) -> dict[str, float]:
    """Mean success over ``n`` lakes of ``split`` of the careful rule under each tie-break:
    {"Down, Up, Left, Right": p, ..., LARGER_OFFSET: p}."""
    env = envs.make("frozen-lake", random_ends=True)
    orders: list[tuple[str, ...] | None] = [*itertools.permutations(ACTIONS), None]
    totals = dict.fromkeys(orders, 0.0)
    for seed in eval_seeds(n, split):
        env.reset(seed)
        rows, start = env.rows, env.state
        table = transition_table(rows, env.slippery)
        for order in orders:
            moves = [careful_move(rows, table, cell, order) for cell in range(len(rows) ** 2)]
            play = partial(_repeat, moves)
            totals[order] += turn_play_success(table, start, play, turns, 1)
    return {
        ", ".join(order) if order else LARGER_OFFSET: total / n for order, total in totals.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="evaluation lakes")
    parser.add_argument("--split", default="dev", choices=["dev", "test"])
    parser.add_argument("--turns", type=int, default=10, help="turns of one action")
    args = parser.parse_args()
    success = success_by_order(args.n, args.split, args.turns)
    ranked = sorted(success.items(), key=lambda item: -item[1])
    for name, value in ranked:
        print(f"{value:8.2%}  {name}")
    result = {
        "command": f"python -m experiments.scan_orders --n {args.n} --split {args.split} "
        f"--turns {args.turns}",
        "lakes": args.n,
        "split": args.split,
        "success": {name: round(value, 4) for name, value in ranked},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scan_orders.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
