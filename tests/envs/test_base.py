"""The registry, StepResult, the budget and the option checks shared by every env."""

import dataclasses

import pytest

from ragen import envs
from ragen.envs.base import (
    EpisodeBudget,
    EpisodeOverError,
    StepResult,
    action_lookup,
    check_int,
    check_probability,
    match_action,
)

ALL_NAMES = [
    "bandit",
    "bandit-rev",
    "bandit-test",
    "sokoban",
    "sokoban-large",
    "sokoban-newvocab",
    "frozen-lake",
    "frozen-lake-8x8",
    "countdown",
    "2048",
    "2048-64",
    "2048-128",
    "cube2",
    "sudoku",
    "sudoku-4x4",
]


def test_names_are_the_registered_games_in_order():
    assert envs.names() == ALL_NAMES


@pytest.mark.parametrize("name", ALL_NAMES)
def test_make_returns_a_text_env(name):
    env = envs.make(name)
    assert isinstance(env, envs.TextEnv)
    assert envs.spec(name).description


def test_unknown_name_lists_the_allowed_names():
    with pytest.raises(ValueError, match=r"unknown environment 'chess'.*sokoban-large"):
        envs.make("chess")


def test_options_override_the_registered_defaults():
    large = envs.make("sokoban-large")
    same = envs.make("sokoban", height=8, width=8, num_boxes=2)
    assert large.reset(11) == same.reset(11)
    assert envs.make("frozen-lake", size=6).reset(0).count("\n") == 5


def test_registering_a_name_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        envs.register("bandit", envs.BanditEnv, "again")


def test_step_result_is_frozen_and_done_is_either_end():
    result = StepResult("x", 1.0, False, True, {})
    assert result.done
    assert not StepResult("x", 1.0, False, False, {}).done
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.reward = 2.0


def test_actions_match_case_insensitively_and_ignore_spaces():
    lookup = action_lookup(("Up", "Left"))
    assert match_action(lookup, "  uP ") == "Up"
    assert match_action(lookup, "LEFT") == "Left"
    assert match_action(lookup, "Upp") is None


def test_budget_truncates_at_the_limit_and_then_refuses_steps():
    budget = EpisodeBudget(2)
    with pytest.raises(EpisodeOverError, match="reset"):
        budget.spend()  # no episode yet
    budget.start()
    budget.spend()
    assert budget.close(terminated=False) is False
    budget.spend()
    assert budget.close(terminated=False) is True  # the second of two actions
    with pytest.raises(EpisodeOverError):
        budget.spend()


def test_a_terminated_episode_is_not_truncated_even_on_the_last_action():
    budget = EpisodeBudget(1)
    budget.start()
    budget.spend()
    assert budget.close(terminated=True) is False
    assert budget.over


def test_option_errors_name_the_option_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"max_actions must be >= 1, got 0"):
        EpisodeBudget(0)
    with pytest.raises(ValueError, match=r"size must be between 2 and 64, got 99"):
        check_int("size", 99, 2, 64)
    with pytest.raises(ValueError, match=r"size must be an integer, got 2\.5"):
        check_int("size", 2.5, 2, 64)
    with pytest.raises(ValueError, match=r"p must be between 0 and 1, got 1\.5"):
        check_probability("p", 1.5)
    with pytest.raises(ValueError, match="p must be greater than 0 and at most 1, got 0"):
        check_probability("p", 0, allow_zero=False)
    with pytest.raises(ValueError, match="p must be a number"):
        check_probability("p", "high")


def test_unknown_option_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="bandit has no option 'num_arms'") as err:
        envs.make("bandit", num_arms=3)
    assert "allowed options: arm_names, high_risk" in str(err.value)
