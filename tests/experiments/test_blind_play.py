"""experiments/blind_play.py: how far a policy that ignores the room gets on Sokoban."""

import itertools
import json

from experiments import blind_play
from ragen.envs.sokoban_levels import solve
from ragen.envs.sokoban_room import Room

# Box X one step right of the player P, target O one step right of the box: Right solves it,
# and Down first takes the player off the box's row.
RIGHT = Room.from_text("#####\n#PXO#\n#___#\n#####")
# Box below the player, target below the box: Down solves it.
DOWN = Room.from_text("###\n#P#\n#X#\n#O#\n###")
# Solved by Down then Right: the box is below-right, pushed right from its left.
CORNER = Room.from_text("#####\n#P__#\n#_XO#\n#####")


def test_a_sequence_solves_a_room_on_any_of_its_steps():
    assert blind_play.solves(RIGHT, ["Right", "Left"])  # solved on the first step
    assert not blind_play.solves(RIGHT, ["Left", "Up"])
    assert blind_play.solves(CORNER, ["Down", "Right"])
    assert blind_play.sequence_success([RIGHT, DOWN, CORNER], ["Down", "Right"]) == 2 / 3


def test_the_best_repeated_sequence_is_found_by_hand():
    # One turn of one move solves one room at most; Down solves DOWN, Right solves RIGHT.
    assert blind_play.best_repeated([RIGHT, DOWN, CORNER], 1, 1) == (["Down"], 1 / 3)
    # Two turns: no sequence solves all three (RIGHT needs Right first, CORNER Down first);
    # Down then Right, the first in MOVES order to solve two, solves DOWN and CORNER.
    assert blind_play.best_repeated([RIGHT, DOWN, CORNER], 2, 1) == (["Down", "Right"], 2 / 3)
    # Each move twice: Down Down then Right Right still solves the same two.
    assert blind_play.best_repeated([RIGHT, DOWN, CORNER], 2, 2) == (
        ["Down", "Down", "Right", "Right"],
        2 / 3,
    )


def test_the_policys_template_is_its_most_frequent_unsolved_sequence(tmp_path):
    episodes = [
        (["Up", "Up", "Left"], False),
        (["Up", "Up", "Left"], False),
        (["Up"], True),  # a prefix that solved its level: it follows the template
        (["Down", "Up", "Left"], False),
    ]
    path = tmp_path / "eval.jsonl"
    path.write_text(
        "".join(
            json.dumps({"turns": [{"actions": actions}], "success": won}) + "\n"
            for actions, won in episodes
        )
    )
    assert blind_play.policy_template(path) == (["Up", "Up", "Left"], 3 / 4, 4)


def test_moves_needed_never_exceeds_a_shortest_solution():
    # ABOVE-like by hand: the box 2 above its target is 2 pushes, after 1 step beside it
    assert blind_play.moves_needed(Room.from_text("#####\n#P__#\n#_X_#\n#___#\n#_O_#\n#####")) == 3
    assert blind_play.moves_needed(RIGHT) == 1 and blind_play.moves_needed(CORNER) == 2
    rooms = blind_play.levels(64, "dev")
    assert all(blind_play.moves_needed(room) <= len(solve(room)) for room in rooms)
    assert sum(blind_play.moves_needed(room) == len(solve(room)) for room in rooms) == 25


def test_the_bound_changes_no_search_result():
    # the pruned search finds what trying every sequence finds, on 32 evaluation rooms
    rooms = blind_play.levels(32, "dev")
    found = blind_play.best_repeated(rooms, 3, 2)
    sequences = itertools.product(blind_play.MOVES, repeat=3)
    rates = [
        (blind_play.sequence_success(rooms, [m for m in s for _ in range(2)]), s) for s in sequences
    ]
    best = max(rate for rate, _ in rates)
    first = next(s for rate, s in rates if rate == best)
    assert found == ([m for m in first for _ in range(2)], best)
