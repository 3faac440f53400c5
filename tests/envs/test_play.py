"""Terminal play: the environment list, fixed action sequences and scripted input."""

import pytest

from ragen import envs
from ragen.envs.play import describe_envs, play, split_actions
from ragen.envs.sokoban_levels import solve


def run(name, seed=0, actions=None, lines=()):
    out, script = [], iter(lines)

    def read(prompt):
        try:
            return next(script)
        except StopIteration:
            raise EOFError from None

    code = play(name, seed, actions, read=read, write=out.append)
    return code, "\n".join(out)


def test_describe_envs_has_one_line_per_name():
    lines = describe_envs().splitlines()
    assert [line.split()[0] for line in lines] == envs.names()
    assert all(len(line.split()) > 2 for line in lines)


def test_fixed_actions_solve_a_sokoban_room_and_print_each_step():
    env = envs.make("sokoban")
    env.reset(0)
    solution = solve(env.room)
    code, text = run("sokoban", 0, solution)
    assert code == 0
    assert text.count("step ") == len(solution)
    assert "Actions: Up, Down, Left, Right." in text  # the instructions come first
    assert "episode over (the game ended): success" in text
    assert f"return {-0.1 * len(solution) + 11:+.2f}" in text


def test_invalid_words_are_reported_and_leftover_actions_are_listed():
    code, text = run("bandit", 0, ["Griffin", "Dragon", "Phoenix"])
    assert code == 0
    assert "step 1: 'Griffin' (not a valid action: nothing happened)" in text
    assert "You pulled Dragon" in text
    assert "ignored after the end: Phoenix" in text


def test_running_out_of_fixed_actions_says_so():
    code, text = run("sokoban", 0, ["Left"])
    assert code == 0
    assert text.endswith("no more actions; the episode is still running")


def test_interactive_play_reads_until_quit():
    code, text = run("sokoban", 0, lines=["Left", "QUIT", "Right"])
    assert code == 0
    assert "step 1: 'Left'" in text and "step 2" not in text


def test_interactive_play_stops_at_end_of_input():
    code, text = run("countdown", 0, lines=["67 - 13"])
    assert code == 0
    assert "step 1: '67 - 13'  reward +0.00" in text  # parses, wrong numbers


def test_interactive_play_ends_with_the_episode():
    code, text = run("countdown", 0, lines=["67 - 13 * 1", "never read"])
    assert code == 0
    assert "reward +1.00" in text and "episode over (the game ended): success" in text


def test_unknown_name_raises_with_the_allowed_names():
    with pytest.raises(ValueError, match="allowed names: bandit, bandit-rev"):
        play("tetris", read=lambda _: "", write=lambda _: None)


@pytest.mark.parametrize(
    ("text", "actions"),
    [
        ("Up,Left,Left", ["Up", "Left", "Left"]),
        ("Up || Down, Right", ["Up", "Down", "Right"]),
        ("(2,3,5), (1,1,4)", ["(2,3,5)", "(1,1,4)"]),
        ("place 5 at row 2 col 3,(1, 2, 3)", ["place 5 at row 2 col 3", "(1, 2, 3)"]),
        (" , ,", []),
        ("(2,3", ["(2,3"]),  # an unclosed parenthesis keeps the rest as one action
        ("2,3)", ["2", "3)"]),
    ],
)
def test_actions_split_on_commas_outside_parentheses(text, actions):
    assert split_actions(text) == actions
