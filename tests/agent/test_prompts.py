"""Prompts: exact texts of the dialogue's messages, and that their examples parse."""

import pytest

from ragen import envs
from ragen.agent.parsing import parse_reply
from ragen.agent.prompts import (
    SYSTEM_PROMPT,
    example_reply,
    first_user_message,
    format_rule,
    reply_prefix,
    turn_user_message,
)

GRID = ("Up", "Down", "Left", "Right")


def test_reply_prefix_opens_the_required_first_block():
    assert reply_prefix(True) == "<think>"
    assert reply_prefix(False) == "<answer>"


def test_system_prompt_is_one_short_line():
    assert "\n" not in SYSTEM_PROMPT and len(SYSTEM_PROMPT.split()) <= 20


@pytest.mark.parametrize(
    ("think", "k", "expected"),
    [
        (True, 1, "Always reply as <think>...</think><answer>...</answer>."),
        (False, 1, "Always reply as <answer>...</answer>."),
        (
            True,
            4,
            "Always reply as <think>...</think><answer>...</answer>, "
            "with up to 4 actions separated by ||.",
        ),
        (False, 2, "Always reply as <answer>...</answer>, with up to 2 actions separated by ||."),
    ],
)
def test_format_rule(think, k, expected):
    assert format_rule(think, k) == expected


def test_example_reply_uses_the_env_words_and_parses_as_it_says():
    assert example_reply(GRID, 3) == (
        "<think>I look at the state, then plan.</think><answer>Up || Down</answer>"
    )
    assert example_reply(GRID, 3, think=False) == "<answer>Up || Down</answer>"
    assert example_reply(("Pull",), 3) == (
        "<think>I look at the state, then plan.</think><answer>Pull</answer>"
    )
    for think in (True, False):
        parsed = parse_reply(example_reply(GRID, 3, think=think), GRID, 3, think=think)
        assert (parsed.actions, parsed.problems) == (("Up", "Down"), ())


def test_no_example_with_one_action_per_turn_or_free_text():
    # One action per turn: the example would only favour the first word (a Bandit arm).
    assert example_reply(("Dragon", "Phoenix"), 1) == ""
    assert example_reply((), 5) == ""


def test_first_user_message_for_a_grid_env():
    text = first_user_message("Rules.\nActions: Up, Down.\n", GRID, 3, "#P_#\n", 10)
    assert text == (
        "Rules.\nActions: Up, Down.\n"
        "Turn 1:\nState:\n#P_#\nYou have 10 actions left.\n"
        "Always reply as <think>...</think><answer>...</answer>, "
        "with up to 3 actions separated by ||. "
        "Example: <think>I look at the state, then plan.</think><answer>Up || Down</answer>"
    )


def test_first_user_message_with_one_action_per_turn_and_no_thinking():
    text = first_user_message("Pick an arm.", ("A", "B"), 1, "Arms: A, B.", 1, think=False)
    assert text == (
        "Pick an arm.\nTurn 1:\nState:\nArms: A, B.\nYou have 1 action left.\n"
        "Always reply as <answer>...</answer>."
    )


def test_first_user_message_for_a_free_text_env_speaks_of_one_answer():
    # The configured per-turn budget does not apply: a free-text answer is one action.
    text = first_user_message("Write an expression.", (), 5, "Numbers: [1, 2]", 1)
    assert text == (
        "Write an expression.\nTurn 1:\nState:\nNumbers: [1, 2]\nYou have 1 action left.\n"
        "Always reply as <think>...</think><answer>...</answer>."
    )


def test_state_keeps_leading_spaces_of_a_grid():
    text = first_user_message("R.", GRID, 1, "\n  P\n G \n", 2)
    assert "State:\n  P\n G \nYou have 2 actions left." in text


@pytest.mark.parametrize(
    ("rewards", "first_line"),
    [
        ([1.0], "Reward: 1"),
        ([-0.1, -0.1, 0.30000000000000004, 10.0], "Rewards: -0.1, -0.1, 0.3, 10"),
        ([], "No action was taken."),
    ],
)
def test_turn_user_message(rewards, first_line):
    text = turn_user_message(3, "P_G", 0, rewards, max_actions_per_turn=2)
    assert text == (
        f"{first_line}\nTurn 3:\nState:\nP_G\nYou have 0 actions left.\n"
        "Always reply as <think>...</think><answer>...</answer>, "
        "with up to 2 actions separated by ||."
    )


def test_turn_user_message_can_leave_the_rule_to_the_first_message():
    text = turn_user_message(2, "s", 4, [0.0], max_actions_per_turn=1, rule=False)
    assert text == "Reward: 0\nTurn 2:\nState:\ns\nYou have 4 actions left."


def test_turn_user_message_without_thinking():
    text = turn_user_message(2, "s", 4, [0.0], max_actions_per_turn=1, think=False)
    assert text == (
        "Reward: 0\nTurn 2:\nState:\ns\nYou have 4 actions left.\n"
        "Always reply as <answer>...</answer>."
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: format_rule(True, 0), "max_actions_per_turn must be >= 1, got 0"),
        (
            lambda: turn_user_message(1, "s", 3, [], max_actions_per_turn=2),
            r"turn must be >= 2, got 1 \(turn 1 is opened by first_user_message\)",
        ),
        (lambda: first_user_message("r", GRID, 2, "s", -1), "actions_left must be >= 0, got -1"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("name", envs.names())
def test_every_env_gets_a_prompt_that_holds_its_instructions_and_state(name):
    env = envs.make(name)
    observation = env.reset(0)
    text = first_user_message(env.instructions(), env.actions, 3, observation, 10)
    assert text.startswith(env.instructions().strip() + "\nTurn 1:\nState:\n")
    assert observation.strip("\n") in text
    example = example_reply(env.actions, 3)
    # An env with action words shows an example reply that its own parser accepts.
    assert bool(example) == bool(env.actions)
    if example:
        assert parse_reply(example, env.actions, 3).format_ok
