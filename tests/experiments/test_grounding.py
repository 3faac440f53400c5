"""experiments/grounding.py: grading a FrozenLake thought against the lake it was written on."""

import json

import pytest

from experiments import grounding
from ragen import envs
from ragen.envs.experts import expert_move
from ragen.envs.frozen_lake import toward_goal
from ragen.run.jsonl import read_jsonl

LAKE = "_ _ O\nO P _\nG _ _"  # player row 2, column 2; goal 1 below and 1 left


def test_a_thought_is_graded_against_the_lake_drawn_above_it():
    right = "The goal G is 1 below and 1 left of me. Holes O are 1 left of me, so I go Down."
    assert grounding.grade_turn(LAKE, right) == (
        "1 below and 1 left of me",
        "1 below and 1 left of me",
        {"offset": True},
    )
    said, _, grades = grounding.grade_turn(LAKE, "The goal G is 2 above me. I go Up.")
    assert (said, grades) == ("2 above me", {"offset": False})
    located = "I am at row 2, column 2. The goal G is at row 3, column 2, 1 below and 1 left of me."
    assert grounding.grade_turn(LAKE + "\nYou are at row 2, column 2.", located)[2] == {
        "offset": True,
        "goal": False,  # the goal is at row 3, column 1
        "me": True,
    }
    offsets = LAKE + "\nThe goal G is 1 below and 1 left of you. A hole O is 1 left of you."
    assert grounding.grade_turn(offsets, right)[2] == {"offset": True}
    assert grounding.grade_turn(LAKE, "I go Down.") is None
    assert grounding.grade_turn("_ _\n_ √", "The goal G is 1 above me.") is None


def test_the_experts_thoughts_are_all_right_and_chance_is_the_offsets_overlap(tmp_path):
    env = envs.make("frozen-lake", random_ends=True, spaced=True, positions=True)
    lines = []
    for seed in range(40):
        observation = env.reset(seed)
        thought = expert_move(env, 2, 10, "located").thought
        lines.append(json.dumps({"turns": [{"observation": observation, "think": thought}]}))
    path = tmp_path / "eval.jsonl"
    path.write_text("\n".join(lines) + "\n")
    graded = grounding.grade_file(path)
    assert graded["turns"] == 40
    assert graded["offset_right"] == graded["me_right"] == graded["goal_right"] == 1.0
    # Said and true offsets are the same list, so chance is the sum of squared shares.
    offsets = [grounding.grade_turn(*_turn(line))[1] for line in lines]
    shares = [offsets.count(o) / 40 for o in set(offsets)]
    assert graded["offset_chance"] == pytest.approx(sum(share * share for share in shares))


def _turn(line: str) -> tuple[str, str]:
    turn = json.loads(line)["turns"][0]
    return turn["observation"], turn["think"]


def test_first_actions_are_graded_against_the_step_toward_the_goal(tmp_path):
    assert grounding.player_and_goal(grounding.lake_of(LAKE)) == (4, 6)
    assert grounding.player_and_goal(("__", "_√")) is None
    assert toward_goal(6, 4, 3) == "Down"  # 1 below and 1 left: a tie goes vertical
    assert toward_goal(2, 0, 3) == "Right"
    assert toward_goal(0, 8, 3) == "Up"
    turns = [
        {"observation": LAKE, "think": "", "actions": ["Down", "Left"]},
        {"observation": LAKE, "think": "", "actions": ["Up"]},
        {"observation": "P _ G\n_ _ _\n_ _ _", "think": "", "actions": ["Up"]},
        {"observation": LAKE, "think": "", "actions": []},  # no action: not graded
    ]
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps({"turns": turns}) + "\n")
    graded = grounding.grade_actions(read_jsonl(path).records)
    assert graded == {
        "acted": 3,
        "toward_action": 1 / 3,
        "top_action": 2 / 3,
        "first_actions": {"Up": 2, "Down": 1},
    }


def test_episodes_are_split_by_whether_their_first_move_stepped_toward_the_goal(tmp_path):
    """A folder's files are graded together; the success of episodes whose first action
    stepped toward the goal is set against the others'."""
    toward = {"observation": LAKE, "think": "", "actions": ["Down"]}
    away = {"observation": LAKE, "think": "", "actions": ["Up"]}
    (tmp_path / "step_000000.jsonl").write_text(
        json.dumps({"turns": [toward, away], "success": True})  # graded by its first turn
        + "\n"
        + json.dumps({"turns": [away], "success": False})
        + "\n"
    )
    (tmp_path / "step_000001.jsonl").write_text(
        json.dumps({"turns": [toward], "success": False})
        + "\n"
        + json.dumps({"turns": [away], "success": True})
        + "\n"
        + json.dumps({"turns": [away], "success": False})
        + "\n"
    )
    graded = grounding.grade_file(tmp_path)
    assert graded["acted"] == 6
    assert graded["toward_action"] == 2 / 6
    assert (graded["toward_episodes"], graded["toward_success"]) == (2, 1 / 2)
    assert (graded["other_episodes"], graded["other_success"]) == (3, 1 / 3)
