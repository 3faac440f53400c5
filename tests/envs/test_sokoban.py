"""Sokoban: hand-checked rewards, the BFS solver, and every generated room solved by replay."""

import pytest

from ragen import envs
from ragen.envs.base import GenerationError
from ragen.envs.sokoban import SokobanEnv
from ragen.envs.sokoban_levels import generate_room, solve
from ragen.envs.sokoban_room import DEFAULT_SYMBOLS, NEW_VOCAB, Room

# Pinned: the same seed must give the same room on every machine and every version.
SEED_0_SMALL = "######\n######\n##___#\n#_XS_#\n#____#\n######"
SEED_0_LARGE = "########\n########\n########\n########\n########\n#___OX_#\n#__O_XP#\n########"


def load(text: str) -> SokobanEnv:
    env = SokobanEnv()
    env.load(Room.from_text(text))
    return env


def replay(env: SokobanEnv, actions: list[str]) -> list:
    return [env.step(action) for action in actions]


def test_generated_rooms_are_pinned_per_seed():
    assert generate_room(0).render() == SEED_0_SMALL
    assert generate_room(0, 8, 8, 2).render() == SEED_0_LARGE
    assert envs.make("sokoban").reset(0) == SEED_0_SMALL
    assert envs.make("sokoban-large").reset(0) == SEED_0_LARGE


def test_pushing_the_last_box_onto_its_target_pays_step_target_and_solve_rewards():
    env = load("#####\n#PXO#\n#####")
    result = env.step("Right")
    assert result.reward == pytest.approx(-0.1 + 1 + 10)
    assert result.terminated and not result.truncated
    assert result.info == {"success": True, "action_valid": True, "action_effective": True}
    assert result.observation == "#####\n#_P√#\n#####"


def test_pushing_a_box_off_a_target_costs_one_and_blocked_moves_cost_the_step():
    env = load("#######\n#P√_XO#\n#######")
    off = env.step("Right")
    assert off.reward == pytest.approx(-1.1)
    assert off.observation == "#######\n#_SXXO#\n#######"  # S: the player on the target
    two_boxes = env.step("Right")  # a box cannot push another box
    assert two_boxes.reward == pytest.approx(-0.1)
    assert not two_boxes.info["action_effective"] and two_boxes.info["action_valid"]
    assert two_boxes.observation == off.observation
    wall = env.step("up")
    assert wall.reward == pytest.approx(-0.1) and not wall.info["action_effective"]


def test_solve_finds_a_hand_checked_shortest_solution():
    room = Room.from_text("######\n#____#\n#_X__#\n#__O_#\n#P___#\n######")
    # Right first: Up, Up, push Right, Up, Right, push Down = 6; Down first needs 8.
    assert solve(room) == ["Up", "Up", "Right", "Up", "Right", "Down"]


def test_solve_says_none_for_a_box_stuck_in_a_corner_and_empty_for_a_solved_room():
    assert solve(Room.from_text("#####\n#X_O#\n#__P#\n#####")) is None
    assert solve(Room.from_text("####\n#P√#\n####")) == []


def test_room_text_round_trips_in_both_vocabularies():
    room = generate_room(5, 8, 8, 2)
    assert Room.from_text(room.render()) == room
    assert Room.from_text(room.render(NEW_VOCAB), NEW_VOCAB) == room


def solve_and_replay(env: SokobanEnv, seed: int) -> None:
    env.reset(seed)
    solution = solve(env.room)
    assert solution, f"seed {seed}: generated room is unsolvable or already solved"
    results = replay(env, solution)
    assert [r.terminated for r in results] == [False] * (len(results) - 1) + [True]
    assert results[-1].info["success"]
    assert results[-1].reward >= 10 - 0.1  # the solving push: +10 (+1 unless box-to-box)
    # Return = -0.1 per action + 10, +1 per box that ends on its target net of starts.
    boxes = env.room.boxes
    assert sum(r.reward for r in results) == pytest.approx(-0.1 * len(solution) + 10 + len(boxes))


def test_every_small_room_of_many_seeds_is_solved_by_replaying_solve():
    env = envs.make("sokoban")
    for seed in range(500):
        solve_and_replay(env, seed)


def test_every_large_room_of_many_seeds_is_solved_by_replaying_solve():
    env = envs.make("sokoban-large")
    for seed in range(200):
        solve_and_replay(env, seed)


@pytest.mark.slow
def test_every_room_of_five_thousand_seeds_per_size_is_solvable():
    for name in ("sokoban", "sokoban-large"):
        env = envs.make(name)
        for seed in range(5000):
            solve_and_replay(env, seed)


def test_no_generated_room_starts_with_a_box_on_a_target():
    for seed in range(200):
        room = generate_room(seed, 8, 8, 2)
        assert room.boxes.isdisjoint(room.targets)
        assert len(room.boxes) == 2 and len(room.targets) == 2


def test_seeds_give_mostly_different_rooms():
    rooms = {generate_room(seed).render() for seed in range(100)}
    assert len(rooms) >= 90


def test_newvocab_draws_the_same_rooms_with_other_symbols():
    plain, newvocab = envs.make("sokoban"), envs.make("sokoban-newvocab")
    swap = str.maketrans({DEFAULT_SYMBOLS[k]: NEW_VOCAB[k] for k in DEFAULT_SYMBOLS})
    for seed in range(20):
        assert newvocab.reset(seed) == plain.reset(seed).translate(swap)
    assert "W wall" in newvocab.instructions()


def test_spaced_rooms_are_the_same_rooms_and_moves_with_a_space_between_cells():
    plain, spaced = SokobanEnv(), SokobanEnv(spaced=True)
    for seed in range(20):
        text = spaced.reset(seed)
        assert text == "\n".join(" ".join(row) for row in plain.reset(seed).splitlines())
        assert Room.from_text(text) == plain.room
        for move in solve(plain.room):
            a, b = plain.step(move), spaced.step(move)
            assert (b.reward, b.terminated) == (a.reward, a.terminated)
            assert b.observation.replace(" ", "") == a.observation
        assert b.terminated
    assert [d.observation for d in spaced.demonstrations()] == [
        "\n".join(" ".join(row) for row in d.observation.splitlines())
        for d in plain.demonstrations()
    ]


def test_spaced_cells_are_one_token_each_for_the_embedded_tokenizer(tokenizer):
    text = SokobanEnv(spaced=True).reset(0)  # walls, floor, box and player
    for row in text.splitlines():
        assert len(tokenizer(row)["input_ids"]) == 6
    # Unspaced, the runs merge: "######" is not six tokens.
    assert len(tokenizer(SEED_0_SMALL.splitlines()[0])["input_ids"]) < 6


def test_the_action_budget_truncates():
    env = envs.make("sokoban", max_actions=3)
    env.reset(0)
    results = replay(env, ["Left", "Left", "Left"])
    assert [r.truncated for r in results] == [False, False, True]
    assert not results[-1].terminated
    with pytest.raises(envs.EpisodeOverError):
        env.step("Up")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"height": 3, "width": 3, "num_boxes": 4}, r"height must be between 5 and 32, got 3"),
        ({"num_boxes": 20}, r"num_boxes \(for a 6×6 room\) must be between 1 and 7, got 20"),
        ({"num_boxes": 0}, r"num_boxes .* must be between 1 and 7, got 0"),
        ({"symbols": {"wall": "#"}}, r"symbols must map each of wall, floor"),
        ({"symbols": {**DEFAULT_SYMBOLS, "box": "#"}}, r"its own single"),
        ({"max_actions": -1}, r"max_actions must be >= 1"),
        ({"pull_steps": 0}, r"pull_steps must be between 1 and 20000, got 0"),
        ({"max_tries": 0}, r"max_tries must be between 1 and 1000, got 0"),
        # Sizes beyond any real room are refused before a float is drawn (a carve walk of
        # 10**11 steps once asked for 2 TiB while a config was only being shown).
        ({"carve_steps": 10**11}, r"carve_steps must be between 1 and 20000, got 100000000000"),
        ({"pull_steps": 20_001}, r"pull_steps must be between 1 and 20000, got 20001"),
        ({"max_tries": 10**9}, r"max_tries must be between 1 and 1000, got 1000000000"),
        ({"spaced": "yes"}, r"spaced must be True or False, got 'yes'"),
    ],
)
def test_bad_options_raise_value_errors_that_say_what_is_allowed(options, message):
    with pytest.raises(ValueError, match=message):
        SokobanEnv(**options)


def test_a_generator_that_cannot_succeed_raises_after_bounded_tries():
    # A 5×5 room has a 3×3 inside: there is no room to pull 4 boxes off their targets.
    with pytest.raises(GenerationError, match="max_tries=20"):
        generate_room(0, 5, 5, 4, max_tries=20)
    env = SokobanEnv(height=5, width=5, num_boxes=4, max_tries=5)
    with pytest.raises(GenerationError):
        env.reset(0)


def test_room_text_errors():
    with pytest.raises(ValueError, match="unknown room symbol"):
        Room.from_text("#####\n#P?O#\n#####")
    with pytest.raises(ValueError, match="one player"):
        Room.from_text("#####\n#_XO#\n#####")


# The rooms of the two worked turns (seeds 2e9 and 2e9 + 1, never played), hand-checked:
# the player is left of the box and walks around it to push it down onto the target; the
# player is right of the box and pushes it two cells left onto the target.
DEMO_ROOMS = ("######\n######\n#__###\n#PX_##\n#_O__#\n######", "######\n" * 4 + "#O_XP#\n######")


def test_demonstrations_are_worked_first_turns_of_two_unplayed_rooms():
    env = envs.make("sokoban")
    demos = env.demonstrations()
    assert [d.observation for d in demos] == list(DEMO_ROOMS)
    assert [d.thought for d in demos] == [
        "The box X is 1 right of me. The target O is 1 below it. I push the box Down.",
        "The box X is 1 left of me. The target O is 2 left of it. I push the box Left.",
    ]
    assert [d.answer for d in demos] == [("Up", "Right", "Down"), ("Left", "Left")]
    assert all(d.instructions == env.instructions() for d in demos)


@pytest.mark.parametrize("name", ["sokoban", "sokoban-newvocab", "sokoban-large"])
def test_each_demonstration_replays_its_rooms_shortest_solution_to_success(name):
    env = envs.make(name)
    demos = env.demonstrations()
    assert len(demos) == 2
    assert demos[0].answer[0] != demos[1].answer[0]  # no fixed first action to copy
    for seed, demo in zip((2_000_000_000, 2_000_000_001), demos, strict=True):
        played = envs.make(name)
        assert played.reset(seed) == demo.observation
        assert played.instructions() == demo.instructions
        solution = solve(played.room)
        assert list(demo.answer) == solution
        results = replay(played, solution)
        assert results[-1].terminated and results[-1].info["success"]
        assert not any(r.terminated for r in results[:-1])


def test_the_large_rooms_thought_names_the_box_pushed_first_and_its_nearest_target():
    demo = envs.make("sokoban-large").demonstrations()[0]
    # The player (row 3, col 3) has a box to its right and one below; the solution pushes
    # the one below first, Down, toward the target two rows under it.
    assert demo.observation.splitlines()[3:7] == ["###PX_O#", "##_X___#", "##__##_#", "##_O___#"]
    assert demo.answer[:2] == ("Down", "Down")
    assert demo.thought == "A box X is 1 below me. A target O is 2 below it. I push the box Down."


def test_coord_renders_ragen2s_coordinate_block_above_the_room():
    # Two targets, one covered by a box; the player stands on the other.
    room = Room.from_text("######\n#____#\n#_X__#\n#__√_#\n#S___#\n######")
    env = envs.make("sokoban", coord=True)
    assert env.load(room) == (
        "Coordinates: \n"
        "Board size: 6 rows x 6 cols (zero-indexed).\n"
        "Targets: (3, 3), (4, 1)\n"
        "Boxes: (2, 2)\n"
        "Boxes on target: (3, 3)\n"
        "Player on target: (4, 1)\n"
        "Grid Map: \n"
        "######\n#____#\n#_X__#\n#__√_#\n#S___#\n######"
    )
    # Up from (4, 1) to (3, 1): off the target; the block follows the move
    after = env.step("Up").observation.splitlines()
    assert after[5] == "Player: (3, 1)" and after[-3] == "#P_√_#"
    assert "Coordinates are (row, col)" in env.instructions()
