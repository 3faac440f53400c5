"""Environment throughput: levels generated and steps taken per second, against references.

    python -m benchmarks.envs [--seconds 2] [--out benchmarks/results/envs.json]

For every registered name: levels/s (`reset(seed)` on fresh seeds, generation included) and
steps/s (random valid actions, text observation included; resets are not timed). In the
same run it compares with what a user would otherwise reach for:

- Sokoban room generation against gym-sokoban's `generate_room` at the same size and box
  count (6×6 with 1 box, 8×8 with 2 boxes). gym-sokoban 0.0.6 fixes its reverse-play search
  depth (ttl) at 300 inside `reverse_playing`; RAGEN's copy exposes it as `search_depth` and
  the reference numbers were taken at depth 10, so we cap it at `--reference-depth` by
  wrapping the module's recursive search, which looks itself up by name. Rooms are only
  worth generating fast if they are not easier, so both sides also report the mean
  shortest solution (from `ragen.envs.sokoban_levels.solve`) of the same number of rooms.
- FrozenLake stepping with its text observation against gymnasium's bare
  `FrozenLakeEnv.step` (unwrapped: no time limit or checker wrappers) on the same map.

gym-sokoban drags in the old `gym`, so it lives in its own venv (see GYM_SOKOBAN_INSTALL);
without it the Sokoban comparison is skipped with a message saying how to install it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ragen import envs
from ragen.envs.frozen_lake import FrozenLakeEnv, generate_map
from ragen.envs.sokoban_levels import generate_room, solve
from ragen.envs.sokoban_room import Room

GYM_SOKOBAN_INSTALL = (
    "python3 -m venv .venv-bench && .venv-bench/bin/pip install numpy 'gymnasium>=1.0' && "
    ".venv-bench/bin/pip install --no-deps gym-sokoban==0.0.6 && "
    ".venv-bench/bin/pip install --no-deps -e . && .venv-bench/bin/python -m benchmarks.envs"
)
SOKOBAN_SIZES = ((6, 6, 1), (8, 8, 2))  # (height, width, boxes): sokoban, sokoban-large
GOAL_SOKOBAN_RATIO = 10.0  # ours at least 10× gym-sokoban's rooms/s
GOAL_FROZEN_LAKE_RATIO = 1 / 3  # ours at least a third of gymnasium's bare steps/s
QUALITY_ROOMS = 200


def rate(work: Callable[[], int], seconds: float) -> float:
    """Items per second: calls `work` (which returns items done) until `seconds` have passed."""
    work()  # warm caches and imports outside the clock
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += work()
    return done / elapsed


# --------------------------------------------------------------------------- every env


def level_rate(name: str, seconds: float) -> float:
    env, seeds = envs.make(name), iter(range(10**9))

    def work() -> int:
        for _ in range(20):
            env.reset(next(seeds))
        return 20

    return rate(work, seconds)


def _answers(env: Any, rng: np.random.Generator, count: int) -> list[str]:
    """Random valid action words; for Countdown, the instance's own solution."""
    if env.actions:
        return [env.actions[k] for k in rng.integers(len(env.actions), size=count).tolist()]
    return [env.instance.solution] * count


def timed_episodes(
    reset: Callable[[int], Any],
    step: Callable[[Any], bool],
    actions: Callable[[], list],
    seconds: float,
) -> float:
    """Steps per second over whole episodes; only the stepping is on the clock."""
    steps, clock, seed = 0, 0.0, 0
    while clock < seconds:
        reset(seed)
        seed += 1
        todo = actions()
        start = time.perf_counter()
        for action in todo:
            steps += 1
            if step(action):
                break
        clock += time.perf_counter() - start
    return steps / clock


def step_rate(name: str, seconds: float) -> float:
    env, rng = envs.make(name), np.random.default_rng(0)
    return timed_episodes(
        env.reset,
        lambda action: env.step(action).done,
        lambda: _answers(env, rng, 200),
        seconds,
    )


# --------------------------------------------------------------------------- gym-sokoban


def load_gym_sokoban(depth: int) -> Any | None:
    """gym-sokoban's room_utils module with its search depth capped, or None if absent.

    Loaded by file path: the package's __init__ imports the old `gym`, which room_utils
    itself does not need.
    """
    spec = importlib.util.find_spec("gym_sokoban")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "envs" / "room_utils.py"
    module_spec = importlib.util.spec_from_file_location("gym_sokoban_room_utils", path)
    room_utils = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(room_utils)
    search = room_utils.depth_first_search

    def capped(state, structure, mapping, box_swaps=0, last_pull=(-1, -1), ttl=300):
        return search(state, structure, mapping, box_swaps, last_pull, min(ttl, depth))

    room_utils.depth_first_search = capped
    return room_utils


def reference_room(room_utils: Any, height: int, width: int, boxes: int) -> Room | None:
    """One gym-sokoban room as a ragen Room (None when it gives up: 'score == 0')."""
    try:
        fixed, state, _ = room_utils.generate_room(
            dim=(height, width), num_steps=int(1.7 * (height + width)), num_boxes=boxes
        )
    except RuntimeWarning:
        return None
    # gym-sokoban codes: fixed 0 wall, 2 target; state 3 box on target, 4 box, 5 player.
    fixed, state = fixed.astype(int).ravel().tolist(), state.astype(int).ravel().tolist()
    return Room(
        height,
        width,
        bytes(int(code != 0) for code in fixed),
        frozenset(i for i, code in enumerate(fixed) if code == 2),
        frozenset(i for i, code in enumerate(state) if code in (3, 4)),
        state.index(5),
    )


def compare_sokoban_size(
    room_utils: Any, height: int, width: int, boxes: int, seconds: float
) -> dict[str, Any]:
    """Rooms/s of both generators at one size, and the mean shortest solution of each."""
    seeds = iter(range(10**9))
    ours = rate(lambda: bool(generate_room(next(seeds), height, width, boxes)), seconds)
    random.seed(0)
    np.random.seed(0)  # gym-sokoban draws from the global generators
    failures = 0

    def reference() -> int:
        # A call that gives up yields no room but costs its time: count only rooms made.
        nonlocal failures
        made = reference_room(room_utils, height, width, boxes) is not None
        failures += not made
        return int(made)

    theirs = rate(reference, seconds)
    reference_rooms: list[Room] = []
    while len(reference_rooms) < QUALITY_ROOMS:
        room = reference_room(room_utils, height, width, boxes)
        if room is not None:
            reference_rooms.append(room)
    our_rooms = [generate_room(s, height, width, boxes) for s in range(QUALITY_ROOMS)]
    return {
        "size": f"{height}x{width}",
        "boxes": boxes,
        "ours_rooms_per_s": ours,
        "gym_sokoban_rooms_per_s": theirs,
        "ratio": ours / theirs,
        "gym_sokoban_failed_calls": failures,
        "ours_mean_shortest_solution": mean_solution(our_rooms),
        "gym_sokoban_mean_shortest_solution": mean_solution(reference_rooms),
    }


def mean_solution(rooms: list[Room]) -> float:
    return statistics.mean(len(solve(room)) for room in rooms)


# --------------------------------------------------------------------------- frozen lake


def compare_frozen_lake(seconds: float) -> dict[str, Any]:
    """Steps/s of ours (text observation) and gymnasium's bare step on one 4×4 map."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymnasiumFrozenLake

    rows = generate_map(0)
    budget = 100  # gymnasium registers FrozenLake-v1 with a 100-step limit
    ours = FrozenLakeEnv(max_actions=budget)
    gym_env = GymnasiumFrozenLake(desc=list(rows), is_slippery=True)
    rng = np.random.default_rng(0)

    def gym_step(action: int) -> bool:
        _, _, terminated, truncated, _ = gym_env.step(action)
        return terminated or truncated

    theirs = timed_episodes(
        lambda seed: gym_env.reset(seed=seed),
        gym_step,
        lambda: rng.integers(4, size=budget).tolist(),
        seconds,
    )
    words = FrozenLakeEnv.actions
    our_rate = timed_episodes(
        lambda seed: ours.load(rows, seed),
        lambda action: ours.step(action).done,
        lambda: [words[k] for k in rng.integers(4, size=budget).tolist()],
        seconds,
    )
    return {
        "size": "4x4",
        "map": list(rows),
        "ours_steps_per_s": our_rate,
        "gymnasium_steps_per_s": theirs,
        "ratio": our_rate / theirs,
    }


# --------------------------------------------------------------------------- report


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
    return str(value)


def table(rows: list[dict[str, Any]], columns: dict[str, str]) -> str:
    """Rows as aligned text; `columns` maps each row key to its header."""
    cells = [list(columns.values())] + [[_cell(row[key]) for key in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    cells.insert(1, ["-" * w for w in widths])
    return "\n".join(
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in cells
    )


SOKOBAN_COLUMNS = {
    "size": "size",
    "boxes": "boxes",
    "ours_rooms_per_s": "ours rooms/s",
    "gym_sokoban_rooms_per_s": "gym-sokoban rooms/s",
    "ratio": "ratio",
    "ours_mean_shortest_solution": "ours mean solution",
    "gym_sokoban_mean_shortest_solution": "theirs mean solution",
}
LAKE_COLUMNS = {
    "size": "map",
    "ours_steps_per_s": "ours steps/s",
    "gymnasium_steps_per_s": "gymnasium steps/s",
    "ratio": "ratio",
}


def run_sokoban_comparison(depth: int, seconds: float) -> dict[str, Any]:
    room_utils = load_gym_sokoban(depth)
    if room_utils is None:
        skipped = f"gym-sokoban not installed: run {GYM_SOKOBAN_INSTALL}"
        print(f"\n{skipped}")
        return {"skipped": skipped}
    rows = [compare_sokoban_size(room_utils, *size, seconds) for size in SOKOBAN_SIZES]
    print(f"\nSokoban generation vs gym-sokoban generate_room (search depth {depth})")
    print(table(rows, SOKOBAN_COLUMNS))
    goal_met = all(row["ratio"] >= GOAL_SOKOBAN_RATIO for row in rows)
    return {"search_depth": depth, "sizes": rows, "goal_met": goal_met}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    parser.add_argument("--reference-depth", type=int, default=10, help="gym-sokoban search depth")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "envs.json")
    args = parser.parse_args(argv)

    per_env = [
        {
            "env": name,
            "levels_per_s": level_rate(name, args.seconds),
            "steps_per_s": step_rate(name, args.seconds),
        }
        for name in envs.names()
    ]
    print(table(per_env, {"env": "env", "levels_per_s": "levels/s", "steps_per_s": "steps/s"}))

    sokoban = run_sokoban_comparison(args.reference_depth, args.seconds)

    lake = compare_frozen_lake(args.seconds)
    lake["goal_met"] = lake["ratio"] >= GOAL_FROZEN_LAKE_RATIO
    print("\nFrozenLake 4x4 step (ours with text observation) vs gymnasium's bare step")
    print(table([lake], LAKE_COLUMNS))

    result = {
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "command": " ".join(
            ["python -m benchmarks.envs", *(sys.argv[1:] if argv is None else argv)]
        ),
        "seconds_per_measurement": args.seconds,
        "envs": {row.pop("env"): row for row in per_env},
        "sokoban_vs_gym_sokoban": sokoban,
        "frozen_lake_vs_gymnasium": lake,
        "goals": {
            "sokoban_ratio_at_least": GOAL_SOKOBAN_RATIO,
            "frozen_lake_ratio_at_least": GOAL_FROZEN_LAKE_RATIO,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
