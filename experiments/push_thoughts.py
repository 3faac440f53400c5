"""How much of a one-box Sokoban policy's thought is its push expert's: each turn of a
`ragen eval` run replayed from its seed, the thought the expert (``sft.sokoban_expert``) writes
from the same room set beside the policy's.

    python -m experiments.push_thoughts EPISODES.jsonl ... --expert push|push_first
        [--option offsets=true --option spaced=true ...] [--name NAME]

Per file, over every turn: the share whose thought is the expert's up to the push direction
(the target's offset from the box, then the direction that offset gives: "The target O is 2
above the box X, so I push the box Up"), up to the end of that first sentence (then where
the cell behind the box lies from the player: ", from the cell below it, 2 below me."), and
whole; each among the turns whose part before it is right; and the move, overall and where
the direction is wrong. Prints a table; with ``--name`` writes each file's figures into
`experiments/results/push_thoughts_NAME.json` (keeping those of other files).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from ragen import envs
from ragen.envs.experts import PUSH_EXPERTS, expert_move
from ragen.run.jsonl import read_jsonl, write_atomic

RESULTS = Path(__file__).parent / "results"
_DIRECTION = re.compile(r"^.*?so I push the box \w+")
_SENTENCE = re.compile(r"^.*?so I push the box .*?\.(?= |$)")
PARTS = ("direction", "sentence", "whole")


def parts(thought: str) -> dict[str, str | None]:
    """A push thought cut at its three depths: ``direction``, up to the push direction ("The
    target O is 2 above the box X, so I push the box Up"); ``sentence``, the first sentence
    (then where the cell behind the box lies from the player: ", from the cell below it, 2
    below me."); ``whole``. None where the thought has no such part."""
    thought = thought.strip()
    direction, sentence = _DIRECTION.match(thought), _SENTENCE.match(thought)
    return {
        "direction": direction[0] if direction else None,
        "sentence": sentence[0] if sentence else None,
        "whole": thought or None,
    }


def thought_shares(episodes_file: Path, expert: str, options: dict) -> dict:
    """Over every turn of ``episodes_file``: the share whose thought equals the expert's up
    to each part (`parts`), each part's share among the turns whose part before it is right,
    the share whose move is the expert's, and that share among the turns whose direction is
    wrong."""
    env = envs.make("sokoban", **{**options, "swap_view": False})
    right = dict.fromkeys(PARTS, 0)
    turns = move = wrong = move_of_wrong = 0
    for episode in read_jsonl(episodes_file).records:
        env.reset(int(episode["seed"]))
        for turn in episode["turns"]:
            expert_turn = expert_move(env, 1, 1, sokoban=expert)
            wanted, mine = parts(expert_turn.thought), parts(turn.get("think") or "")
            hits = {k: mine[k] is not None and mine[k] == wanted[k] for k in PARTS}
            same_move = list(turn["actions"][:1]) == list(expert_turn.answer)
            turns += 1
            move += same_move
            for k in PARTS:
                right[k] += hits[k]
            if not hits["direction"]:
                wrong += 1
                move_of_wrong += same_move
            if not turn["actions"] or env.step(turn["actions"][0]).terminated:
                break

    def share(hit: int, of: int) -> float | None:
        return hit / of if of else None

    return {
        "turns": turns,
        **{k: share(right[k], turns) for k in PARTS},
        "sentence_given_direction": share(right["sentence"], right["direction"]),
        "whole_given_sentence": share(right["whole"], right["sentence"]),
        "move": share(move, turns),
        "move_given_wrong_direction": share(move_of_wrong, wrong),
    }


COLUMNS = (
    ("direction", "direction"),
    ("sentence", "first sentence"),
    ("whole", "whole thought"),
    ("sentence_given_direction", "sentence, direction right"),
    ("whole_given_sentence", "whole, sentence right"),
    ("move", "move"),
    ("move_given_wrong_direction", "move, direction wrong"),
)


def _options(pairs: list[str]) -> dict:
    options: dict = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        options[key] = {"true": True, "false": False}.get(value, value)
    return options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("episodes", nargs="+", type=Path, help="eval trajectories (eval.jsonl)")
    parser.add_argument("--expert", choices=PUSH_EXPERTS, required=True)
    parser.add_argument("--name", help="write experiments/results/push_thoughts_NAME.json")
    parser.add_argument("--option", action="append", default=[], help="env option key=value")
    args = parser.parse_args(argv)
    options = _options(args.option)
    rows = {str(path): thought_shares(path, args.expert, options) for path in args.episodes}
    print("| episodes | turns | " + " | ".join(title for _, title in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 2) + "|")
    for path, r in rows.items():
        cells = " | ".join("—" if r[k] is None else f"{r[k]:.1%}" for k, _ in COLUMNS)
        print(f"| {path} | {r['turns']} | {cells} |")
    if args.name:  # each file's entry replaced, the others kept: one record of many calls
        path = RESULTS / f"push_thoughts_{args.name}.json"
        record = json.loads(path.read_text()) if path.exists() else {"runs": {}}
        for file, shares in rows.items():
            record["runs"][file] = {"expert": args.expert, "options": options, **shares}
        write_atomic(path, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
