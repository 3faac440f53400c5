"""2048: merge rules, rewards and ends by hand, seeded spawns, the expert, hostile words."""

import math
import os
import random
import subprocess
import sys

import pytest

from ragen import cli, config, envs
from ragen.envs.base import EpisodeOverError, ExpertError
from ragen.envs.experts import expert_move, has_expert
from ragen.envs.game2048 import (
    Game2048Env,
    Merge,
    can_move,
    draw,
    expert_turn,
    greedy_move,
    move,
    move_thought,
    parse,
    slide,
    spawn,
    spawns,
    turn_thought,
)

SEED_0 = ". . . .\n. . 2 .\n. . . .\n. 2 . ."  # pinned: same seed, same board, every machine


def reward(merged_sum):
    return 0.1 * math.log2(1 + merged_sum)


@pytest.mark.parametrize(
    ("line", "slid", "merges"),
    [
        ((2, 2, 2, 2), (4, 4, 0, 0), ((2, 0, 1), (2, 2, 3))),  # two pairs, not one 8
        ((2, 2, 4, 0), (4, 4, 0, 0), ((2, 0, 1),)),  # the new 4 does not merge again
        ((4, 0, 4, 8), (8, 8, 0, 0), ((4, 0, 2),)),  # across a gap; the new 8 stays
        ((8, 8, 8, 0), (16, 8, 0, 0), ((8, 0, 1),)),  # the pair nearest the side first
        ((0, 0, 0, 2), (2, 0, 0, 0), ()),
        ((2, 4, 8, 16), (2, 4, 8, 16), ()),
        ((0, 0, 0, 0), (0, 0, 0, 0), ()),
    ],
)
def test_a_line_slides_and_each_tile_merges_at_most_once(line, slid, merges):
    assert slide(line) == (slid, merges)


BOARD = parse("2 . 2 4\n. . . 4\n2 . . 8\n. . . 8")


@pytest.mark.parametrize(
    ("action", "after", "merged_sum"),
    [
        ("Left", "4 4 . .\n4 . . .\n2 8 . .\n8 . . .", 4),
        ("Right", ". . 4 4\n. . . 4\n. . 2 8\n. . . 8", 4),
        ("Up", "4 . 2 8\n. . . 16\n. . . .\n. . . .", 4 + 8 + 16),
        ("Down", ". . . .\n. . . .\n. . . 8\n4 . 2 16", 4 + 8 + 16),
    ],
)
def test_each_move_on_a_board_by_hand(action, after, merged_sum):
    board, merges = move(BOARD, action)
    assert draw(board) == after
    assert sum(2 * m.value for m in merges) == merged_sum
    env = Game2048Env()
    env.load(BOARD, seed=1)
    result = env.step(action)
    assert result.reward == pytest.approx(reward(merged_sum))
    assert result.info == {"success": False, "action_valid": True, "action_effective": True}
    # The new tile, a 2 or a 4, on a cell the move left empty.
    new = [(c, v) for c, (v, was) in enumerate(zip(env.board, board, strict=True)) if v != was]
    assert len(new) == 1 and board[new[0][0]] == 0 and new[0][1] in (2, 4)


def test_merges_name_the_cells_the_pair_stood_on():
    assert move(BOARD, "Down")[1] == (Merge(2, (8, 0)), Merge(8, (15, 11)), Merge(4, (7, 3)))


def test_the_opening_board_is_pinned_and_the_same_in_another_process():
    moves = ["Left", "Up", "Right", "Down", "Left", "Left", "Up"]
    env = envs.make("2048")
    assert env.reset(0) == SEED_0
    here = [env.reset(11), *(env.step(m).observation for m in moves)]
    code = (
        "from ragen import envs\n"
        "env = envs.make('2048')\n"
        f"print(repr([env.reset(11), *(env.step(m).observation for m in {moves!r})]))"
    )
    # Another process, with another string-hash seed: nothing may hang on set or dict order.
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == repr(here)
    assert len(set(here)) == len(here)


def test_new_tiles_fall_on_empty_cells_uniformly_and_are_4_one_time_in_10():
    board = parse("2 . . .\n. 4 . .\n. . . .\n. . . 8")
    rng = random.Random(3)
    draws = [spawn(board, rng) for _ in range(10_000)]
    cells = [next(c for c in range(16) if new[c] != board[c]) for new in draws]
    values = [new[c] for new, c in zip(draws, cells, strict=True)]
    assert set(cells) == {c for c in range(16) if not board[c]}
    assert all(660 <= cells.count(c) <= 880 for c in set(cells))  # 769 each, ±4 sd
    assert set(values) == {2, 4}
    assert 880 <= values.count(4) <= 1120  # 1000, ±4 sd
    assert sum(p for p, _ in spawns(board)) == pytest.approx(1.0)


def test_a_move_that_changes_nothing_costs_what_the_instructions_say():
    env = Game2048Env()
    assert "a move that changes nothing costs 0.1" in env.instructions()
    start = env.load(parse("2 4 . .\n. . . .\n. . . .\n. . . ."))
    result = env.step("Left")
    assert (result.reward, result.terminated, result.truncated) == (-0.1, False, False)
    assert result.info == {"success": False, "action_valid": True, "action_effective": False}
    assert result.observation == start and env.render() == start
    junk = env.step("Jump")  # no action word: a free no-op, as for every env
    assert (junk.reward, junk.info["action_valid"], junk.observation) == (0.0, False, start)


def test_making_the_target_tile_wins_at_once_with_no_new_tile():
    env = envs.make("2048-64")
    env.load(parse("32 32 . .\n. . . .\n. . 2 .\n. . . ."))
    result = env.step("Left")
    assert result.observation == "64 . . .\n. . . .\n2 . . .\n. . . ."
    assert (result.terminated, result.truncated, result.info["success"]) == (True, False, True)
    assert result.reward == pytest.approx(reward(64))
    with pytest.raises(EpisodeOverError):
        env.step("Right")


def test_a_board_no_move_changes_ends_the_game_lost():
    lost_next = parse("2 4 2 4\n4 2 4 2\n8 64 128 256\n16 32 64 .")
    env = Game2048Env()
    env.load(lost_next)
    for stuck in ("Left", "Up"):  # row 4 is packed left, column 4 up: nothing moves
        assert env.step(stuck).reward == -0.1
    result = env.step("Right")  # the new tile fills (4, 1) and no two neighbours match
    assert result.observation.splitlines()[3] in ("2 16 32 64", "4 16 32 64")
    assert (result.terminated, result.info["success"], result.reward) == (True, False, 0.0)
    assert not can_move(env.board) and can_move(lost_next)
    with pytest.raises(ExpertError, match="game is over"):
        expert_turn(env.board, 3)


def test_the_action_budget_truncates():
    env = Game2048Env(max_actions=2)
    env.reset(0)
    assert not env.step("Jump").done
    last = env.step("Left")
    assert (last.terminated, last.truncated) == (False, True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"target": 100}, "target must be a power of two"),
        ({"target": 4}, "target must be between 8 and 131072"),
        ({"target": 2**18}, "target must be between 8 and 131072"),
        ({"target": True}, "target must be an integer"),
        ({"target": "64"}, "target must be an integer"),
        ({"max_actions": 0}, "max_actions must be >= 1"),
    ],
)
def test_bad_options_raise_value_errors_that_say_what_is_allowed(options, message):
    with pytest.raises(ValueError, match=message):
        Game2048Env(**options)


@pytest.mark.parametrize(
    "board", [(2,) * 15, (3,) + (0,) * 15, (1,) + (0,) * 15, (-2,) + (0,) * 15]
)
def test_load_rejects_boards_that_are_not_16_tiles_of_powers_of_two(board):
    with pytest.raises(ValueError, match="a 2048 board is 16 cells"):
        Game2048Env().load(board)


def test_the_target_is_said_and_registered_targets_are_64_and_128():
    assert "You win by making a 128 tile" in envs.make("2048-128").instructions()
    targets = {name: envs.make(name).target for name in ("2048", "2048-64", "2048-128")}
    assert targets == {"2048": 2048, "2048-64": 64, "2048-128": 128}
    assert envs.make("2048", target=256).target == 256


HOSTILE = [
    "",
    "   ",
    "Left\x00",
    "Left || Up",
    "left left",
    "Lef",
    "ＬＥＦＴ",  # fullwidth letters
    "\u200bLeft",  # a zero-width space is no space
    "İ",
    "Up" * 10_000,
    "<answer>Up</answer>",
    "2048",
]


@pytest.mark.parametrize("word", HOSTILE, ids=lambda w: repr(w[:20]))
def test_hostile_words_are_free_no_ops(word):
    env = envs.make("2048")
    start = env.reset(5)
    result = env.step(word)
    assert (result.reward, result.observation, result.terminated) == (0.0, start, False)
    assert result.info == {"success": False, "action_valid": False, "action_effective": False}


def test_action_words_ignore_case_and_surrounding_space():
    env = envs.make("2048")
    env.reset(5)
    assert env.step(" lEFT\t\n").info["action_valid"]


THOUGHT_BOARD = parse("2 2 . .\n. . . .\n8 8 . .\n. . . 4")


def test_the_thought_names_the_merges_the_empty_cells_and_the_largest_tile():
    assert move_thought(THOUGHT_BOARD, "Left") == (
        "Left merges 8+8=16 in row 3 and 2+2=4 in row 1, leaving 13 empty cells, the most of "
        "any move. The largest tile, 16, ends at row 3, column 1; I build toward the top-left "
        "corner."
    )
    assert move_thought(THOUGHT_BOARD, "Left", located=True).startswith(
        "Left merges 8+8=16 in row 3 (columns 1 and 2) and 2+2=4 in row 1 (columns 1 and 2),"
    )
    assert move_thought(THOUGHT_BOARD, "Up") == (
        "Up merges nothing, leaving 11 empty cells. The largest tile, 8, ends at row 2, "
        "column 1; I build toward the top-left corner."
    )
    four_pairs = parse("2 2 2 2\n4 4 . .\n8 8 . .\n. . . .")
    assert move_thought(four_pairs, "Left") == (
        "Left merges 8+8=16 in row 3, 4+4=8 in row 2 and 2 more pairs, leaving 12 empty "
        "cells, the most of any move. The largest tile, 16, ends at row 3, column 1; I build "
        "toward the top-left corner."
    )
    assert move_thought(parse("4 4 . .\n. . . .\n. . . .\n. . . 2"), "Up").endswith(
        "The largest tile, 4, ends in the top-left corner, where I keep it."
    )


def test_a_turn_plans_further_moves_only_where_every_new_tile_agrees():
    env = envs.make("2048")
    planned = 0
    for seed in range(20):
        env.reset(seed)
        moves = expert_turn(env.board, 3)
        board = move(env.board, moves[0])[0]
        boards = {board}
        for later in moves[1:]:
            boards = {b for after in boards for _, b in spawns(after)}
            assert {greedy_move(b) for b in boards} == {later}
            boards = {move(b, later)[0] for b in boards}
            planned += 1
        assert len(moves) <= 3 and expert_turn(env.board, 1) == moves[:1]
    assert planned > 0
    assert turn_thought(THOUGHT_BOARD, ("Left", "Up")).endswith(
        "Then Up, which I pick wherever the new tile appears."
    )
    assert turn_thought(THOUGHT_BOARD, ("Left", "Up", "Left")).endswith(
        "Then Up and Left, which I pick wherever the new tiles appear."
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_expert_reaches_128_and_never_makes_a_move_that_changes_nothing(seed):
    env = envs.make("2048-128")
    assert has_expert(env)
    env.reset(seed)
    result = None
    while result is None or not result.done:
        turn = expert_move(env, 4, 200)
        for word in turn.answer:
            result = env.step(word)
            assert result.info["action_effective"]
            if result.done:
                break
    assert result.info["success"]


def test_demonstrations_are_worked_first_turns_of_two_unplayed_boards():
    env = envs.make("2048-64")
    demos = env.demonstrations()
    assert len(demos) == env.demo_count == 2
    assert [d.answer[0] for d in demos] == ["Left", "Up"]
    for demo in demos:
        assert demo.instructions == env.instructions()
        assert demo.thought == turn_thought(parse(demo.observation), demo.answer)


def test_a_name_of_digits_works_in_configs_and_commands(tmp_path, capsys):
    assert config.preset_for_env("2048-128") == "2048"
    assert config.load("2048").env.name == "2048-64"
    cfg, _ = cli._sft_config(cli.parse_args(["sft", "2048", "--out", str(tmp_path / "run")]))
    assert (cfg.env.name, cfg.rollout.max_turns) == ("2048", 10)
    cfg = cli._eval_config(cli.parse_args(["eval", "--env", "2048"]))
    assert cfg.env.name == "2048"
    assert cli.main(["play", "2048", "--seed", "0", "--actions", "Left,Up"]) == 0
    out = capsys.readouterr().out
    assert "step 2: 'Up'  reward +0.23" in out
