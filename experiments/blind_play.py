"""How far a state-blind policy gets on the Sokoban evaluation levels: the floor a Sokoban
success rate is read against, and a test of whether a trained policy still reads the room.

    python -m experiments.blind_play [--n 256] [--turns 5] [--per-turn 2]
        [--eval runs/RUN/eval-final/trajectories/eval.jsonl ...] [--out NAME]

A blind policy plays the same actions on every level. Two are measured on the ``--n``
evaluation levels (the seeds `ragen eval` and training evaluations use):

- the best sequence in which each of ``--turns`` turns repeats one move ``--per-turn`` times
  (``Right Right | Up Up | …``: the shape a collapsed policy takes), found by trying all
  4**turns of them;
- for each ``--eval`` file (an evaluation's episodes), the policy's action template (its
  most frequent sequence among the episodes it did not solve) replayed on every level;
  beside it the share of the file's episodes whose actions are that sequence or a prefix of
  it (`ragen eval` prints it as "one action sequence"): near 1, the policy no longer looks
  at the room.

Exact: the levels are stepped by `SokobanEnv` itself, no sampling. Prints a table and writes
``experiments/results/blind_play[_NAME].json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragen import envs
from ragen.envs.sokoban_room import Room, cell_distance
from ragen.monitor.metrics import action_template
from ragen.train.evaluator import eval_seeds

RESULTS = Path(__file__).parent / "results"
MOVES = ("Up", "Down", "Left", "Right")


def levels(n: int, split: str = "dev", options: dict | None = None) -> list[Room]:
    """The first rooms of the ``n`` Sokoban evaluation levels of ``split``, drawn with the
    env ``options``."""
    env = envs.make("sokoban", **(options or {}))
    rooms = []
    for seed in eval_seeds(n, split):
        env.reset(seed)
        rooms.append(env.room)
    return rooms


def solves(room: Room, moves: list[str]) -> bool:
    """Whether playing ``moves`` from ``room`` solves it (on any step)."""
    env = envs.make("sokoban", max_actions=max(len(moves), 1))
    env.load(room)
    return any(env.step(move).terminated for move in moves)


def sequence_success(rooms: list[Room], moves: list[str]) -> float:
    """The share of ``rooms`` that ``moves`` solves."""
    return sum(solves(room, moves) for room in rooms) / len(rooms)


def moves_needed(room: Room) -> int:
    """A lower bound on the moves that solve ``room``: each box's walls-blind distance to its
    nearest target, plus the walk until the player stands beside the nearest box."""
    width = room.width
    loose = room.boxes - room.targets
    if not loose:
        return 0
    pushes = sum(min(cell_distance(box, t, width) for t in room.targets) for box in loose)
    walk = min(cell_distance(room.player, box, width) for box in loose) - 1
    return pushes + walk


def best_repeated(rooms: list[Room], turns: int, per_turn: int) -> tuple[list[str], float]:
    """The sequence of ``turns`` turns, each one move ``per_turn`` times, that solves the most
    rooms (the first in MOVES order on a tie), and its success. A depth-first search over
    the turns that carries each unsolved room's state down, drops a room once the moves
    left cannot solve it (`moves_needed`), and skips a branch once even solving every room
    still open could not beat the best sequence found."""
    env = envs.make("sokoban", max_actions=per_turn)
    total = turns * per_turn
    best: tuple[list[str], int] = ([], -1)

    def visit(prefix: list[str], open_rooms: list[Room], solved: int) -> None:
        nonlocal best
        if len(prefix) == total:
            best = max(best, (prefix, solved), key=lambda found: found[1])
            return
        left = total - len(prefix)
        open_rooms = [room for room in open_rooms if moves_needed(room) <= left]
        if solved + len(open_rooms) <= best[1]:
            return
        for move in MOVES:
            still, won = [], 0
            for room in open_rooms:
                env.load(room)
                if any(env.step(move).terminated for _ in range(per_turn)):
                    won += 1
                else:
                    still.append(env.room)
            visit([*prefix, *[move] * per_turn], still, solved + won)

    visit([], rooms, 0)
    return best[0], best[1] / len(rooms)


def policy_template(path: Path) -> tuple[list[str], float, int]:
    """From an evaluation's episodes: the policy's action template, the share of episodes
    that follow it (`monitor.metrics.action_template`), and the episode count."""
    episodes = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        actions = [a for turn in record["turns"] for a in (turn.get("actions") or [])]
        episodes.append((actions, bool(record.get("success"))))
    template, share = action_template(episodes)
    if not template:
        raise SystemExit(f"{path}: every episode solved its level; no full sequence to read")
    return list(template), share, len(episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="evaluation levels")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--per-turn", type=int, default=2)
    parser.add_argument("--eval", type=Path, nargs="*", default=[], help="eval.jsonl files")
    parser.add_argument("--out", help="suffix of the results file: blind_play_NAME.json")
    args = parser.parse_args()
    rooms = levels(args.n)
    best, rate = best_repeated(rooms, args.turns, args.per_turn)
    pairs = " | ".join(
        " ".join(best[i : i + args.per_turn]) for i in range(0, len(best), args.per_turn)
    )
    print(f"{'policy':<58}{'success':>9}{'follows':>9}")
    print(f"{'best repeated-move sequence: ' + pairs:<58}{rate:>9.2%}{'':>9}")
    policies = []
    for path in args.eval:
        template, follows, episodes = policy_template(path)
        replayed = sequence_success(rooms, template)
        print(f"{str(path)[-56:]:<58}{replayed:>9.2%}{follows:>9.2%}")
        print(f"  its sequence: {' '.join(template)}")
        policies.append(
            {
                "eval": str(path),
                "episodes": episodes,
                "sequence": template,
                "replayed_success": round(replayed, 4),
                "episodes_following_it": round(follows, 4),
            }
        )
    command = "python -m experiments.blind_play"
    command += f" --n {args.n} --turns {args.turns} --per-turn {args.per_turn}"
    command += (" --eval " + " ".join(map(str, args.eval)) if args.eval else "") + (
        f" --out {args.out}" if args.out else ""
    )
    result = {
        "command": command,
        "eval_levels": args.n,
        "best_repeated": {"sequence": best, "success": round(rate, 4)},
        "policies": policies,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / (f"blind_play_{args.out}.json" if args.out else "blind_play.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
