"""Sudoku: seeded puzzles with one solution, the move grammar, the reward table, the expert."""

import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen import envs
from ragen.agent.parsing import parse_reply
from ragen.envs.base import EpisodeOverError, ExpertError
from ragen.envs.experts import expert_move
from ragen.envs.sudoku import (
    DIFFICULTIES,
    Move,
    Puzzle,
    SudokuEnv,
    blank_count,
    count_solutions,
    dig,
    draw,
    generate_puzzle,
    hidden_single,
    naked_single,
    parse_move,
    units,
)

# A 4×4 solution, and the puzzle of it with row 1 and column 1 empty: row 1 takes 2, 3, 4
# from its columns, then column 1 what its rows leave. One solution, by hand.
SOLUTION = (1, 2, 3, 4, 3, 4, 1, 2, 2, 1, 4, 3, 4, 3, 2, 1)
GIVENS = (0, 0, 0, 0, 0, 4, 1, 2, 0, 1, 4, 3, 0, 3, 2, 1)
HAND = Puzzle(4, GIVENS, SOLUTION)
SEED_0_4X4 = (0, 0, 3, 1, 0, 0, 4, 2, 4, 1, 0, 3, 3, 0, 1, 4)  # pinned: every machine


def is_solution(grid, size):
    digits = set(range(1, size + 1))
    return all({grid[cell] for cell in unit} == digits for group in units(size) for unit in group)


def test_draw_numbers_rows_and_columns_and_rules_off_the_boxes():
    assert draw(GIVENS, 4) == (
        "    1 2   3 4\n1   . . | . .\n2   . 4 | 1 2\n    ----+----\n3   . 1 | 4 3\n4   . 3 | 2 1"
    )
    nine = draw(generate_puzzle(0).solution, 9).splitlines()
    assert nine[0] == "    1 2 3   4 5 6   7 8 9"
    assert nine[4] == "    ------+-------+------"
    assert [line.index("|") for line in nine if "|" in line] == [10] * 9  # columns line up
    assert [line.index("+") for line in nine if "+" in line] == [10, 10]


def test_count_solutions_counts_by_hand():
    assert count_solutions((0,) * 16, 4, limit=1000) == 288  # every 4×4 grid there is
    assert count_solutions(GIVENS, 4) == 1
    assert count_solutions(SOLUTION, 4) == 1
    # Rows 1 and 3 hold 1 2 and 2 1 in columns 1-2, across two boxes: emptied, the two
    # digits can trade places in all four cells.
    swap = (0, 0, 3, 4, 3, 4, 1, 2, 0, 0, 4, 3, 4, 3, 2, 1)
    assert count_solutions(swap, 4) == 2
    assert count_solutions((1, 1, *(0,) * 14), 4) == 0  # the givens already clash


def test_dig_stops_short_of_more_cells_than_one_solution_allows():
    assert dig(SOLUTION, 4, 16, random.Random(0)) == ()  # an empty grid has 288
    assert dig(SOLUTION, 4, 0, random.Random(0)) == SOLUTION


def test_puzzles_are_pinned_and_the_same_in_another_process():
    assert generate_puzzle(0, 4).givens == SEED_0_4X4
    code = (
        "from ragen.envs.sudoku import generate_puzzle as g; "
        "print([g(0, 4).givens, g(7).givens, g(3, 9, 'hard').givens])"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    here = [generate_puzzle(0, 4), generate_puzzle(7), generate_puzzle(3, 9, "hard")]
    assert other == str([puzzle.givens for puzzle in here])


@pytest.mark.parametrize("difficulty", list(DIFFICULTIES))
@pytest.mark.parametrize(("size", "seeds"), [(4, 40), (9, 6)])
def test_puzzles_have_one_solution_and_the_difficultys_blanks(size, difficulty, seeds):
    puzzles = [generate_puzzle(seed, size, difficulty) for seed in range(seeds)]
    for puzzle in puzzles:
        assert puzzle.givens.count(0) == blank_count(size, difficulty)
        assert count_solutions(puzzle.givens, size) == 1
        assert is_solution(puzzle.solution, size)
        assert all(g in (0, s) for g, s in zip(puzzle.givens, puzzle.solution, strict=True))
    assert len({p.givens for p in puzzles}) == seeds


def test_blank_counts_are_the_shares_of_the_cells():
    assert [blank_count(9, d) for d in DIFFICULTIES] == [32, 40, 48]
    assert [blank_count(4, d) for d in DIFFICULTIES] == [6, 8, 9]


@pytest.mark.parametrize(
    ("text", "move"),
    [
        ("place 5 at row 2 col 3", Move(2, 3, 5)),
        ("  Place 5 at Row 2, Column 3. ", Move(2, 3, 5)),
        ("PLACE 1 ROW 4 COL 4", Move(4, 4, 1)),
        ("(2,3,5)", Move(2, 3, 5)),
        ("( 2 , 3 , 5 )", Move(2, 3, 5)),
        ("2,3,5", Move(2, 3, 5)),
        ("(10,0,99)", Move(10, 0, 99)),  # read as written; the rules judge it
    ],
)
def test_moves_parse(text, move):
    assert parse_move(text) == move


@pytest.mark.parametrize(
    "text",
    [
        "",
        "5",
        "place 5",
        "place five at row 2 col 3",
        "place 5 at row 2 col 3 and place 1 at row 1 col 1",
        "I place 5 at row 2 col 3",
        "(2,3,5",
        "2,3,5)",
        "(2,3)",
        "(2,3,5,1)",
        "(2;3;5)",
        "(١,٢,٣)",  # Arabic-Indic digits are digits to int(), not to this game
        "place 5 at row 2 col 3" + " " * 100,
        "(1234,1,1)",
    ],
)
def test_other_text_is_no_move(text):
    assert parse_move(text) is None


def test_the_reward_and_termination_table_by_hand():
    env = SudokuEnv(size=4)
    start = env.load(HAND)

    def play(action):
        result = env.step(action)
        return result.reward, result.terminated, result.info.get("error")

    assert play("hello") == (0.0, False, None)
    assert env.render() == start
    assert play("(1,2,4)") == (-0.1, False, "4 is already in column 2")
    assert play("(1,1,4)") == (-0.1, False, "4 is already in the box of row 1, column 1")
    assert play("(3,4,1)") == (-0.1, False, "row 3, column 4 is already filled")  # a given
    assert play("(5,1,1)") == (-0.1, False, "row 5 is off the grid (1-4)")
    assert play("(1,1,0)") == (-0.1, False, "digit 0 is off the grid (1-4)")
    assert env.render() == start  # a move that breaks a rule changes nothing
    assert play("place 2 at row 1 col 2") == (1.0, False, None)
    assert play("place 2 at row 1 col 2") == (-0.1, False, "row 1, column 2 is already filled")
    assert play("place 3 at row 1 col 3") == (1.0, False, None)
    assert play("(1,4,4)") == (1.0, False, None)
    assert play("(1,1,1)") == (1.0, False, None)
    assert play("(2,1,3)") == (1.0, False, None)
    assert play("(3,1,2)") == (1.0, False, None)
    result = env.step("(4,1,4)")  # the last empty cell: +1 and the +10 bonus
    assert (result.reward, result.terminated, result.truncated) == (11.0, True, False)
    assert result.info == {
        "success": True,
        "action_valid": True,
        "action_effective": True,
        "right_digit": True,
    }
    with pytest.raises(EpisodeOverError):
        env.step("(1,1,1)")


def test_a_wrong_digit_that_fits_pays_half_and_a_grid_it_dead_ends_is_over():
    env = SudokuEnv(size=4)
    env.load(HAND)
    result = env.step("(1,1,2)")  # fits its row, column and box; the solution has 1
    assert (result.reward, result.info["right_digit"]) == (0.5, False)
    # Row 1, column 2 now sees 2 in its row and 4, 1, 3 in its column: nothing fits.
    assert result.terminated and not result.truncated and not result.info["success"]


def test_the_budget_truncates_and_counts_every_step():
    env = SudokuEnv(size=4, max_actions=3)
    env.load(HAND)
    assert not env.step("(1,2,2)").done
    assert not env.step("junk").done
    last = env.step("(1,2,4)")
    assert last.truncated and not last.terminated
    env = envs.make("sudoku")  # one step per cell, as RAGEN-2: 81
    env.reset(0)
    assert [env.step("junk").truncated for _ in range(81)] == [False] * 80 + [True]


def play_expert(env):
    """Play the expert's moves until the episode ends; the rewards and the last result."""
    rewards, thoughts = [], []
    while True:
        move = expert_move(env, max_actions=1, actions_left=1)
        assert len(move.answer) == 1
        thoughts.append(move.thought)
        result = env.step(move.answer[0])
        rewards.append(result.reward)
        if result.done:
            return rewards, thoughts, result


@pytest.mark.parametrize("difficulty", list(DIFFICULTIES))
@pytest.mark.parametrize(("name", "seeds"), [("sudoku-4x4", range(30)), ("sudoku", range(4))])
def test_every_expert_replay_solves_its_puzzle(name, seeds, difficulty):
    env = envs.make(name, difficulty=difficulty)
    for seed in seeds:
        env.reset(seed)
        blanks = env.grid.count(0)
        rewards, thoughts, last = play_expert(env)
        assert last.terminated and last.info["success"]
        assert rewards == [1.0] * (blanks - 1) + [11.0]
        assert all(t.startswith(("Row", "Column", "The box")) for t in thoughts)


def test_without_a_single_the_expert_says_the_other_digits_leave_no_solution():
    env = envs.make("sudoku", difficulty="hard")
    env.reset(9)  # singles run out after 23 moves
    rewards, thoughts, last = play_expert(env)
    assert last.info["success"] and sum(rewards) == 48 + 10
    stuck = [t for t in thoughts if t.startswith("No cell is forced by a single.")]
    assert stuck and "the grid has no solution" in stuck[0]


def test_singles_and_their_reasons():
    grid = list(GIVENS)
    assert naked_single(grid, 4).reason == (
        "Row 1, column 2 sees 1, 3 and 4 in its row, column and box, so only 2 fits there."
    )
    row = [0] * 16
    row[6] = row[9] = 3  # 3s in box 2 and column 2: row 1 takes its 3 in column 1 only
    assert naked_single(row, 4) is None
    assert hidden_single(row, 4).reason == (
        "Row 1 still needs a 3, and column 1 is its only empty cell where 3 fits, so 3 goes "
        "at row 1, column 1."
    )
    column = [0] * 16
    column[7], column[14] = 1, 4  # a 1 in box 2, a 4 at row 4 column 3
    assert hidden_single(column, 4).move == Move(3, 3, 1)
    assert hidden_single(column, 4).reason.startswith("Column 3 still needs a 1, and row 3 is")
    box = [0] * 81
    for row_, col_, digit in [(4, 7, 4), (5, 2, 3), (7, 9, 6), (8, 8, 2), (8, 9, 8), (9, 6, 4)]:
        box[(row_ - 1) * 9 + col_ - 1] = digit
    box[80] = 5
    # The bottom-right box needs a 4: row 9 and column 7 hold one, so only row 7, column 8.
    assert naked_single(box, 9) is None
    assert hidden_single(box, 9).reason == (
        "The box of rows 7-9, columns 7-9 still needs a 4, and row 7, column 8 is its only "
        "empty cell where 4 fits, so 4 goes at row 7, column 8."
    )


def test_the_expert_refuses_a_grid_it_cannot_solve():
    env = SudokuEnv(size=4)
    env.load(HAND)
    env.step("(1,1,2)")
    with pytest.raises(
        ExpertError, match="has a wrong digit at row 1, column 1: it cannot be solved"
    ):
        env.expert(1, False)
    env.load(Puzzle(4, SOLUTION, SOLUTION))
    with pytest.raises(ExpertError, match="has no empty cell: there is no move to make"):
        env.expert(1, False)
    with pytest.raises(ValueError, match="a 4×4 puzzle in a size=9 env"):
        SudokuEnv().load(HAND)


def test_demonstrations_are_right_first_moves_of_unplayed_puzzles():
    env = envs.make("sudoku-4x4")
    worked = env.demonstrations()
    assert len(worked) == env.demo_count == 2
    for seed, demo in zip((2_000_000_001, 2_000_000_002), worked, strict=True):
        assert demo.instructions == env.instructions()
        other = SudokuEnv(size=4)
        assert demo.observation == other.reset(seed)
        assert other.step(demo.answer[0]).reward == 1.0


STATED = (
    "+1 for the right digit",
    "+0.5 for a digit that fits",
    "-0.1 for a move that breaks a rule",
    "+10 more for the move that solves",
    "not a move changes nothing and scores 0",
    "place 5 at row 2 col 3",
    "(2,3,5)",
)


def test_the_instructions_state_the_rewards_the_game_pays():
    nine, four = envs.make("sudoku").instructions(), envs.make("sudoku-4x4").instructions()
    assert all(words in nine and words in four for words in STATED)
    assert "3×3 box" in nine and "2×2 box" in four and "1 to 4" in four


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"size": 5}, "size must be one of 4, 9, got 5"),
        ({"size": 4.0}, "size must be an integer, got 4.0"),
        ({"difficulty": "extreme"}, "difficulty must be one of easy, medium, hard"),
        ({"max_actions": 0}, "max_actions must be >= 1, got 0"),
    ],
)
def test_bad_options_raise_value_errors_that_say_what_is_allowed(options, message):
    with pytest.raises(ValueError, match=message):
        SudokuEnv(**options)


# Replies built from the pieces of the grammar and junk, through the reply parser and the
# env: nothing raises, a non-move is a no-op, and a move pays one of the table's rewards.
PIECES = st.sampled_from(
    ["place", "at", "row", "col", "column", "(", ")", ",", " ", "1", "2", "4", "9", "10", "0",
     ".", "||", "<answer>", "</answer>", "\n", "٣", "İ", "\x00", "-"]
)  # fmt: skip
ANSWERS = st.lists(st.one_of(PIECES, st.text(max_size=6)), max_size=24).map("".join)


@settings(max_examples=300, deadline=None)
@given(answer=ANSWERS)
def test_hostile_answers_are_no_ops_or_moves_the_table_pays(answer):
    env = SudokuEnv(size=4)
    before = env.load(HAND)
    parsed = parse_reply(f"<think>t</think><answer>{answer}</answer>", env.actions, 1)
    for action in parsed.actions:
        result = env.step(action)
        if parse_move(action) is None:
            assert (result.reward, result.info["action_valid"]) == (0.0, False)
            assert result.observation == before
        else:
            assert result.reward in (-0.1, 0.5, 1.0)
            assert result.info["action_valid"]


@settings(max_examples=100, deadline=None)
@given(row=st.integers(0, 999), col=st.integers(0, 999), digit=st.integers(0, 999))
def test_both_spellings_of_a_move_read_back(row, col, digit):
    move = Move(row, col, digit)
    assert parse_move(f"place {digit} at row {row} col {col}") == move
    assert parse_move(f"({row},{col},{digit})") == move
