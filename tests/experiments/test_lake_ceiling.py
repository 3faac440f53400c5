"""experiments/lake_ceiling.py's careful rule: away from a hole beside, else toward the goal."""

import pytest

from experiments import lake_ceiling
from ragen.envs.experts import goal_probabilities, policy_success
from ragen.envs.frozen_lake import start_cell, toward_goal, transition_table


def test_with_a_hole_beside_the_careful_move_walks_away_from_it():
    # The player (S) has a hole above and the goal 1 below, 2 right. Toward the goal is Right,
    # which slips Up into the hole one time in three; Down slips Left (the edge: it stays) or
    # Right, never Up.
    rows = ("HFF", "SFF", "FFG")
    table = transition_table(rows)
    start = start_cell(rows)
    assert toward_goal("".join(rows).index("G"), start, 3) == "Right"
    assert lake_ceiling.careful_move(rows, table, start) == "Down"
    # from the cell right of the start no hole is beside: the move nearest the goal on average
    assert lake_ceiling.careful_move(rows, table, start + 1) in ("Down", "Right")


def test_the_careful_rule_beats_walking_toward_the_goal_here():
    rows = ("HFF", "SFF", "FFG")
    table = transition_table(rows)
    careful = policy_success(table, lake_ceiling.careful_policy(rows, table), 10)
    toward = policy_success(table, lake_ceiling.toward_goal_policy(rows), 10)
    start = start_cell(rows)
    # exact arithmetic: within 10 actions the careful walk never falls (it only runs out of
    # actions), walking toward the goal falls in at times; on this lake the careful walk is
    # value iteration's best, 67.6%
    assert careful[10][start] == pytest.approx(0.676116, abs=1e-6)
    assert careful[10][start] == pytest.approx(goal_probabilities(table, 10)[10][start])
    assert toward[10][start] == pytest.approx(0.390405, abs=1e-6)
