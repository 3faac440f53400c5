"""Sokoban written out for a small model: the offsets line (with the push cells), the push
expert that reads only it, and the swapped view of the blind-play check."""

import pytest

from ragen import envs
from ragen.envs.experts import ExpertError, expert_move, push_plan
from ragen.envs.sokoban_levels import solve
from ragen.envs.sokoban_room import PUSH_FROM, Room
from ragen.train.evaluator import eval_seeds

# The box is 1 below and 1 right of the player, its target 2 below it: the push rule goes
# Right to the cell above the box (Down is aside: the player is level with that cell's row),
# then pushes Down twice; the shortest solution takes as many moves.
ABOVE = Room.from_text("######\n#P___#\n#_X__#\n#____#\n#_O__#\n######")
# The player stands between the box and its target: the box goes Up from below it, 2 below
# the player, and the box blocks the way down. Up is back (farther on the line that still
# needs walking), Left and Right are aside: the first aside, Left, leads around the box.
BETWEEN = Room.from_text("######\n#_O__#\n#_P__#\n#_X__#\n#____#\n######")


def _play(room: Room, limit: int = 10) -> tuple[list[str], list[str], bool]:
    """The push expert's thoughts and moves from ``room`` until it ends, and whether it won."""
    env = envs.make("sokoban", offsets=True, max_actions=limit)
    env.load(room)
    thoughts, moves = [], []
    for left in range(limit, 0, -1):
        move = expert_move(env, 2, left, sokoban="push")
        assert len(move.answer) == 1  # one move a turn, whatever the turn allows
        thoughts.append(move.thought)
        moves.append(move.answer[0])
        result = env.step(move.answer[0])
        if result.terminated or result.truncated:
            return thoughts, moves, result.terminated
    return thoughts, moves, False


def test_the_offsets_line_places_the_box_its_target_and_the_walls_beside():
    env = envs.make("sokoban", offsets=True)
    assert env.load(ABOVE).splitlines()[-1] == (
        "The box X is 1 below and 1 right of you; the target O is 2 below it. "
        "Walls # are 1 above you and 1 left of you."
    )
    after = env.step("Right").observation.splitlines()
    assert after[:-1] == ["######", "#_P__#", "#_X__#", "#____#", "#_O__#", "######"]
    assert (
        after[-1]
        == "The box X is 1 below you; the target O is 2 below it. A wall # is 1 above you."
    )
    env.load(BETWEEN)  # Down pushes the box away from its target, onto row 4
    assert env.step("Down").observation.splitlines()[-1] == (
        "The box X is 1 below you; the target O is 3 above it. No wall is beside you."
    )


def test_with_several_boxes_each_loose_box_gets_its_nearest_free_target():
    room = Room.from_text("#######\n#P_X_O#\n#_____#\n#_X__O#\n#######")
    env = envs.make("sokoban", offsets=True, height=5, width=7, num_boxes=2)
    assert env.load(room).splitlines()[-1] == (
        "A box X is 2 right of you; the nearest free target O is 2 right of it. "
        "A box X is 2 below and 1 right of you; the nearest free target O is 3 right of it. "
        "Walls # are 1 above you and 1 left of you."
    )
    env.step("Right")
    assert env.step("Right").observation.splitlines()[-1] == (  # the first box pushed once
        "A box X is 1 right of you; the nearest free target O is 1 right of it. "
        "A box X is 2 below and 1 left of you; the nearest free target O is 3 right of it. "
        "A wall # is 1 above you."
    )
    # onto its target: the other box is the one loose box left, sent to the free target
    assert env.step("Right").observation.splitlines()[-1] == (
        "A box X is 2 below and 2 left of you; the nearest free target O is 3 right of it. "
        "A wall # is 1 above you."
    )


def test_the_push_rule_by_hand():
    plan = push_plan(ABOVE)
    assert (plan.push, plan.kinds, plan.move) == (
        "Down",
        ("wall", "aside", "wall", "nearer"),
        "Right",
    )
    assert plan.behind == 1 * 6 + 2  # row 1, column 2: above the box
    plan = push_plan(BETWEEN)
    assert (plan.push, plan.kinds, plan.move) == ("Up", ("back", "box", "aside", "aside"), "Left")
    assert plan.behind == 4 * 6 + 2


def test_the_push_expert_plays_hand_rooms_to_success_with_true_thoughts():
    thoughts, moves, won = _play(ABOVE)
    assert won and moves == ["Right", "Down", "Down"] and len(solve(ABOVE)) == 3
    assert thoughts == [
        "The target O is 2 below the box X, so I push the box Down, from the cell above it, "
        "1 right of me. Up wall, Down aside, Left wall, Right nearer. I go Right.",
        "The target O is 2 below the box X, so I push the box Down, from the cell above it, "
        "where I stand. I push Down.",
        "The target O is 1 below the box X, so I push the box Down, from the cell above it, "
        "where I stand. I push Down.",
    ]
    thoughts, moves, won = _play(BETWEEN)
    # around the box on the left, then two pushes up: as short as the shortest solution
    assert won and moves == ["Left", "Down", "Down", "Right", "Up", "Up"]
    assert len(solve(BETWEEN)) == 6
    assert thoughts[0] == (
        "The target O is 2 above the box X, so I push the box Up, from the cell below it, "
        "2 below me. Up back, Down box, Left aside, Right aside. I go Left."
    )


def test_each_push_thought_names_the_move_it_makes_on_the_evaluation_rooms():
    env = envs.make("sokoban", offsets=True, spaced=True, max_actions=10)
    won = 0
    for seed in eval_seeds(64, "dev"):
        env.reset(seed)
        for left in range(10, 0, -1):
            move = expert_move(env, 1, left, sokoban="push")
            assert move.thought.endswith(f" {move.answer[0]}.")
            result = env.step(move.answer[0])
            if result.terminated or result.truncated:
                won += result.terminated
                break
    assert won == 47  # pinned: the rule solves 47 of these 64 rooms in 10 moves


def test_the_push_expert_refuses_a_room_of_two_boxes():
    env = envs.make("sokoban-large")
    env.reset(0)
    with pytest.raises(ExpertError, match="one box"):
        expert_move(env, 1, 10, sokoban="push")
    with pytest.raises(ValueError, match="sokoban must be one of optimal, push, push_first"):
        expert_move(env, 1, 10, sokoban="greedy")


def test_the_swapped_view_shows_the_paired_room_and_plays_its_own():
    seed = eval_seeds(2, "test")[0]
    shown, played = envs.make("sokoban", offsets=True), envs.make("sokoban", offsets=True)
    env = envs.make("sokoban", offsets=True, swap_view=True)
    assert env.reset(seed) == shown.reset(seed ^ 1) != played.reset(seed)
    assert env.instructions() == played.instructions()
    moves = solve(played.room)
    assert moves
    for move in moves:
        mine, theirs, view = env.step(move), played.step(move), shown.step(move)
        assert (mine.reward, mine.terminated) == (theirs.reward, theirs.terminated)
        assert mine.observation == view.observation  # the paired room, moved the same way
        if view.terminated:  # solved, it stays as it is; nothing else is stepped
            break
    assert env.room == played.room  # the room played is the seed's own
    with pytest.raises(ValueError, match="swap_view shows the room of the seed paired"):
        env.load(ABOVE)


def test_push_first_pushes_along_the_offset_the_line_names_first():
    # the target is 1 above and 2 left of the box: the larger offset is Left, the first Up
    room = Room.from_text("#######\n#O____#\n#___X_#\n#_____#\n#___P_#\n#######")
    env = envs.make("sokoban", offsets=True, height=6, width=7)
    assert (
        env.load(room)
        .splitlines()[-1]
        .startswith("The box X is 2 above you; the target O is 1 above and 3 left of it.")
    )
    assert push_plan(room).push == "Left" and push_plan(room, first=True).push == "Up"
    move = expert_move(env, 1, 10, sokoban="push_first")
    assert move.thought == (
        "The target O is 1 above and 3 left of the box X, so I push the box Up, from the cell "
        "below it, 1 above me. Up nearer, Down wall, Left aside, Right aside. I go Up."
    )


def test_push_cells_writes_where_each_push_toward_the_target_starts():
    env = envs.make("sokoban", offsets=True, push_cells=True)
    assert env.load(ABOVE).splitlines()[-1] == (
        "The box X is 1 below and 1 right of you; the target O is 2 below it. It goes Down "
        "from the cell above it, 1 right of you. Walls # are 1 above you and 1 left of you."
    )
    assert env.step("Right").observation.splitlines()[-1] == (
        "The box X is 1 below you; the target O is 2 below it. It goes Down from the cell "
        "above it, where you stand. A wall # is 1 above you."
    )
    # The target 2 below and 2 left of the box: two pushes bring it nearer, the vertical first.
    room = Room.from_text("######\n#P___#\n#__X_#\n#____#\n#O___#\n######")
    assert env.load(room).splitlines()[-1] == (
        "The box X is 1 below and 2 right of you; the target O is 2 below and 2 left of it. "
        "It goes Down from the cell above it, 2 right of you, or Left from the cell right of "
        "it, 1 below and 3 right of you. Walls # are 1 above you and 1 left of you."
    )
    with pytest.raises(ValueError, match="push_cells adds to the offsets line"):
        envs.make("sokoban", push_cells=True)


@pytest.mark.parametrize("expert", ["push", "push_first"])
def test_with_push_cells_the_push_thoughts_where_is_copied_from_the_line(expert):
    # Every turn of the rule on the dev rooms: the cell its thought pushes from, as the
    # thought says it ("… from the cell below it, 2 below me"), is in the line with "you".
    env = envs.make("sokoban", offsets=True, push_cells=True, spaced=True, max_actions=10)
    turns = 0
    for seed in eval_seeds(16, "dev"):
        line = env.reset(seed).splitlines()[-1]
        for left in range(10, 0, -1):
            move = expert_move(env, 1, left, sokoban=expert)
            plan = push_plan(env.room, first=expert == "push_first")
            stated = move.thought.split(", so I push the box ")[1].split(". ")[0]
            assert stated.startswith(f"{plan.push}, from the cell {PUSH_FROM[plan.push]} it, ")
            said = stated.replace(", from", " from").replace("me", "you").replace(" I ", " you ")
            assert said in line, (said, line)
            turns += 1
            result = env.step(move.answer[0])
            if result.terminated or result.truncated:
                break
            line = result.observation.splitlines()[-1]
    assert turns > 50
