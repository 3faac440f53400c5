"""Do a FrozenLake agent's thoughts place the goal where the lake shows it?

    python -m experiments.grounding EPISODES.jsonl|FOLDER [...] [--out NAME]

Reads saved episodes (a run's ``eval-*/trajectories/eval.jsonl`` or ``trajectories/*.jsonl``;
a folder's ``*.jsonl`` files are graded together, e.g. every training step of a run) and,
for every turn whose thought says where the goal is ("The goal G is 2 above and 1 left of
me.", or the located form "I am at row 3, column 2. The goal G is at row 1, column 1, 2
above and 1 left of me."), compares what it says with the lake drawn in that turn's
observation: the goal's offset from the player, and where the thought gives rows and
columns, the player's and the goal's cells. A model that reads the lake says them right; one
that learned the sentence alone says them right about as often as chance: ``offset_chance``
is the share a thought would get right if its offset were said of another turn's lake drawn
at random (the sum over offsets of how often each is said times how often it is true). The
first action of every turn is graded too: ``toward_action``, the share that steps toward the
goal along its larger offset (vertical on a tie; uniform play: 25%), and ``top_action``, the
share of the most frequent first action (a policy that ignores the lake plays one action
whatever it shows). Whether acting on the lake pays in these episodes: ``toward_success``
and ``other_success``, the success of the episodes whose very first action steps toward the
goal and of the others (the signal RL has to find), with their counts. Prints a table; with
``--out NAME`` writes ``experiments/results/grounding_NAME.json``. No model runs.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from ragen.envs.base import grid_cell, relative_position
from ragen.envs.frozen_lake import toward_goal
from ragen.run.jsonl import read_jsonl

RESULTS = Path(__file__).parent / "results"
_PLAYER = "PX√"  # the player on ice, in a hole, on the goal
_GOAL_SAID = re.compile(r"The goal G is (?:at (row \d+, column \d+), )?(.*? me)\.")
_ME_SAID = re.compile(r"I am at (row \d+, column \d+)\.")


def lake_of(observation: str) -> tuple[str, ...]:
    """The lake's rows from an observation, spaced or not; the lines in words under it
    (``positions``, ``offsets``) are skipped."""
    rows = [line.replace(" ", "") for line in observation.splitlines()]
    return tuple(row for row in rows if row and not any(c.islower() for c in row))


def player_and_goal(rows: tuple[str, ...]) -> tuple[int, int] | None:
    """The player's cell and the goal's on a drawn lake; None when no goal shows (the player
    stands on it)."""
    flat = "".join(rows)
    if "G" not in flat:
        return None
    return next(cell for cell, tile in enumerate(flat) if tile in _PLAYER), flat.index("G")


def grade_turn(observation: str, thought: str) -> tuple[str, str, dict[str, bool]] | None:
    """The goal's offset a turn's thought gives, the lake's true one, and what the thought
    got right: ``offset``, and ``me`` / ``goal`` (the cells) where it names them; None when
    the thought does not say where the goal is or the lake shows no goal (the player is on
    it)."""
    rows = lake_of(observation)
    said = _GOAL_SAID.search(thought or "")
    cells = player_and_goal(rows)
    if said is None or cells is None:
        return None
    (me, goal), size = cells, len(rows)
    (row, col), (goal_row, goal_col) = divmod(me, size), divmod(goal, size)
    true = relative_position(goal_row - row, goal_col - col, "me")
    grades = {"offset": said[2] == true}
    if said[1] is not None:
        grades["goal"] = said[1] == grid_cell(goal, size)
        mine = _ME_SAID.search(thought)
        grades["me"] = mine is not None and mine[1] == grid_cell(me, size)
    return said[2], true, grades


def _steps_toward(turn: dict) -> bool | None:
    """Whether a turn's first action steps toward the goal (`frozen_lake.toward_goal`); None
    when it took no action or its lake shows no goal."""
    rows = lake_of(turn["observation"])
    cells = player_and_goal(rows)
    if not turn.get("actions") or cells is None:
        return None
    me, goal = cells
    return turn["actions"][0] == toward_goal(goal, me, len(rows))


def grade_actions(episodes: list[dict]) -> dict:
    """Turns that acted on a lake with a goal, the share whose first action steps toward
    it, and the share of the most frequent first action; then the success of the episodes
    whose first action stepped toward the goal and of the others (where episodes say)."""
    firsts: Counter[str] = Counter()
    toward = 0
    outcomes: dict[bool, list[bool]] = {True: [], False: []}
    for episode in episodes:
        for number, turn in enumerate(episode["turns"]):
            stepped = _steps_toward(turn)
            if stepped is None:
                continue
            firsts[turn["actions"][0]] += 1
            toward += stepped
            if number == 0 and "success" in episode:
                outcomes[stepped].append(bool(episode["success"]))
    acted = sum(firsts.values())
    if not acted:
        return {"acted": 0}
    graded = {
        "acted": acted,
        "toward_action": toward / acted,
        "top_action": max(firsts.values()) / acted,
        "first_actions": dict(firsts.most_common()),
    }
    for stepped, name in ((True, "toward"), (False, "other")):
        if outcomes[stepped]:
            graded[f"{name}_episodes"] = len(outcomes[stepped])
            graded[f"{name}_success"] = sum(outcomes[stepped]) / len(outcomes[stepped])
    return graded


def read_episodes(path: Path) -> list[dict]:
    """The episodes of a JSONL file, or of every ``*.jsonl`` file in a folder, in name order."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    return [episode for file in files for episode in read_jsonl(file).records]


def grade_file(path: Path) -> dict:
    """Over every graded turn of a file (or a folder's files): how many, the share right of
    each kind, and the offset's chance share (see the module docstring); then its first
    actions."""
    episodes = read_episodes(path)
    totals: dict[str, int] = {}
    said_counts: Counter[str] = Counter()
    true_counts: Counter[str] = Counter()
    for episode in episodes:
        for turn in episode["turns"]:
            graded = grade_turn(turn["observation"], turn.get("think") or "")
            if graded is None:
                continue
            said, true, grades = graded
            said_counts[said] += 1
            true_counts[true] += 1
            for key, right in grades.items():
                totals[key] = totals.get(key, 0) + int(right)
    turns = sum(said_counts.values())
    if not turns:
        return {"turns": 0, **grade_actions(episodes)}
    chance = sum(n * true_counts[offset] for offset, n in said_counts.items()) / turns**2
    shares = {f"{key}_right": totals[key] / turns for key in sorted(totals)}
    return {"turns": turns, **shares, "offset_chance": chance, **grade_actions(episodes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("episodes", nargs="+", type=Path, help="saved episodes (JSONL)")
    parser.add_argument("--out", help="write experiments/results/grounding_OUT.json")
    args = parser.parse_args()
    rows = {str(path): grade_file(path) for path in args.episodes}
    keys = (
        "offset_right",
        "offset_chance",
        "me_right",
        "goal_right",
        "toward_action",
        "top_action",
        "toward_success",
        "other_success",
    )
    heads = ("offset", "chance", "me", "goal", "toward", "top act", "won tow", "won oth")
    print(f"{'episodes':<64}{'turns':>7}" + "".join(f"{h:>9}" for h in heads))
    for name, row in rows.items():
        cells = "".join(f"{row[key]:>9.1%}" if key in row else f"{'-':>9}" for key in keys)
        print(f"{name[-64:]:<64}{row['turns']:>7}{cells}")
    if args.out:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"grounding_{args.out}.json"
        command = "python -m experiments.grounding " + " ".join(map(str, args.episodes))
        path.write_text(json.dumps({"command": command, "files": rows}, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
