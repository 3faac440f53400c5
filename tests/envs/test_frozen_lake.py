"""FrozenLake: maps, rendering, and transition tables equal to gymnasium's on the same map."""

import pytest
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymnasiumFrozenLake

from ragen import envs
from ragen.envs.base import GenerationError
from ragen.envs.experts import expert_move
from ragen.envs.frozen_lake import (
    FrozenLakeEnv,
    _demo_thought,
    describe_offsets,
    describe_positions,
    draw,
    edges_beside,
    generate_map,
    holes_beside,
    is_valid,
    shortest_path,
    transition_table,
)

SEED_0_MAP = ("SFFF", "HHFF", "FHHF", "HFFG")  # pinned: same seed, same map, every machine


def gymnasium_table(rows, slippery=True):
    gym_env = GymnasiumFrozenLake(desc=list(rows), is_slippery=slippery)
    n = len(rows) ** 2
    return [[list(gym_env.P[s][a]) for a in range(4)] for s in range(n)]


def ours(rows, slippery=True):
    return [
        [list(outcomes) for outcomes in per_action]
        for per_action in transition_table(rows, slippery)
    ]


@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("slippery", [True, False])
@pytest.mark.parametrize("random_ends", [False, True])
def test_transition_table_equals_gymnasiums_on_the_same_map(size, slippery, random_ends):
    for seed in range(10):
        rows = generate_map(seed, size, random_ends=random_ends)
        assert ours(rows, slippery) == gymnasium_table(rows, slippery)


def test_slippery_moves_split_in_thirds_like_gymnasium():
    # From the start (top-left), "Down" goes down, or slides left (stays) or right.
    outcomes = transition_table(SEED_0_MAP)[0][1]
    assert [(p, s) for p, s, _, _ in outcomes] == [
        (0.33333333333333337, 0),  # left: into the edge, stay
        (1 / 3, 4),  # down: onto the hole at (1, 0)
        (0.33333333333333337, 1),  # right
    ]
    assert outcomes[1][3] is True  # the hole ends the episode
    assert sum(p for p, *_ in outcomes) == pytest.approx(1.0)


def test_maps_are_pinned_valid_and_mostly_different():
    assert generate_map(0) == SEED_0_MAP
    maps = [generate_map(seed) for seed in range(100)]
    assert all(is_valid(m) and m[0][0] == "S" and m[-1][-1] == "G" for m in maps)
    assert len(set(maps)) >= 80
    assert not is_valid(("SH", "HG"))


def test_random_ends_put_start_and_goal_on_random_distinct_cells_of_valid_lakes():
    maps = [generate_map(seed, random_ends=True) for seed in range(200)]
    assert all(is_valid(m) and "".join(m).count("S") == "".join(m).count("G") == 1 for m in maps)
    starts = {"".join(m).index("S") for m in maps}
    goals = {"".join(m).index("G") for m in maps}
    assert starts == goals == set(range(16))  # every cell serves as either


def test_rendering_uses_the_agent_symbols():
    assert draw(SEED_0_MAP, 0) == "P___\nOO__\n_OO_\nO__G"
    assert draw(SEED_0_MAP, 4) == "____\nXO__\n_OO_\nO__G"  # in the hole below the start
    assert draw(SEED_0_MAP, 15).endswith("O__√")
    assert envs.make("frozen-lake").reset(0) == "P___\nOO__\n_OO_\nO__G"


def test_a_non_slippery_walk_reaches_the_goal_with_reward_one():
    env = FrozenLakeEnv(slippery=False)
    env.load(("SFF", "HHF", "FFG"), seed=0)
    results = [env.step(a) for a in ("Right", "Right", "Down", "Down")]
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 1.0]
    assert [r.terminated for r in results] == [False, False, False, True]
    assert results[-1].info["success"]
    assert results[-1].observation == "___\nOO_\n__√"


def test_the_instructions_tell_the_ice_the_env_plays_by():
    slippery, firm = FrozenLakeEnv().instructions(), FrozenLakeEnv(slippery=False).instructions()
    assert "with probability 1/3" in slippery and "not slippery" not in slippery
    assert "The ice is not slippery: you move in the direction you choose." in firm
    assert "probability" not in firm


def test_falling_in_a_hole_ends_without_reward():
    env = FrozenLakeEnv(slippery=False)
    env.load(("SF", "HG"), seed=0)
    edge = env.step("Up")
    assert not edge.info["action_effective"] and edge.reward == 0.0 and not edge.done
    hole = env.step("down")
    assert hole.terminated and hole.reward == 0.0 and not hole.info["success"]
    assert hole.observation == "__\nXG"


def test_sampled_slips_follow_the_table():
    # From the start of a 3×3 open lake, "Right" goes right, up (edge: stay) or down, 1/3 each.
    env = FrozenLakeEnv()
    counts = {0: 0, 1: 0, 3: 0}
    for seed in range(3000):
        env.load(("SFF", "FFF", "FFG"), seed)
        env.step("Right")
        counts[env.state] += 1
    assert all(900 <= c <= 1100 for c in counts.values()), counts  # ±4 sd around 1000


def test_same_seed_same_slips():
    first, second = envs.make("frozen-lake"), envs.make("frozen-lake")
    for seed in range(10):
        first.reset(seed)
        second.reset(seed)
        for action in ["Right", "Down"] * 5:
            a, b = first.step(action), second.step(action)
            assert a == b
            if a.done:
                break


def test_the_action_budget_truncates():
    env = FrozenLakeEnv(slippery=False, max_actions=2)
    env.load(("SFF", "FFF", "FFG"), seed=0)
    assert not env.step("Up").truncated
    last = env.step("Left")
    assert last.truncated and not last.terminated


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"p": 1.5}, r"p must be greater than 0 and at most 1, got 1\.5"),
        ({"p": 0}, r"p must be greater than 0"),
        ({"size": 1}, r"size must be between 2 and 64, got 1"),
        ({"slippery": "yes"}, r"slippery must be True or False"),
        ({"spaced": 1}, r"spaced must be True or False, got 1"),
        ({"random_ends": "yes"}, r"random_ends must be True or False, got 'yes'"),
        ({"positions": "no"}, r"positions must be True or False, got 'no'"),
        ({"offsets": 2}, r"offsets must be True or False, got 2"),
        ({"max_actions": 0}, r"max_actions must be >= 1"),
        # A lake that cannot be made would otherwise be redrawn for hours.
        ({"max_tries": 10**12}, r"max_tries must be between 1 and 10000, got 1000000000000"),
    ],
)
def test_bad_options_raise_value_errors_that_say_what_is_allowed(options, message):
    with pytest.raises(ValueError, match=message):
        FrozenLakeEnv(**options)


def test_a_lake_with_almost_no_ice_raises_after_bounded_tries():
    with pytest.raises(GenerationError, match="max_tries=20"):
        generate_map(0, 8, p=0.05, max_tries=20)
    with pytest.raises(ValueError, match="max_tries must be between 1 and 10000"):
        generate_map(0, 64, p=0.01, max_tries=10_001)


@pytest.mark.parametrize("rows", [("SS", "FG"), ("SF", "FF"), ("SFF", "FG"), ("SG", "GX")])
def test_load_rejects_bad_maps(rows):
    with pytest.raises(ValueError, match="square rows of S, F, H, G with one S and one G"):
        FrozenLakeEnv().load(rows, seed=0)


def test_a_start_anywhere_is_where_the_player_stands():
    env = FrozenLakeEnv(slippery=False)
    assert env.load(("FFF", "FSH", "GFF"), seed=0) == "___\n_PO\nG__"
    assert env.state == 4
    assert env.step("Left").observation == "___\nP_O\nG__"
    assert env.step("Down").info["success"]


def shortest_length(rows) -> int | None:
    """Steps to the goal over non-hole tiles: BFS over the non-slippery transition table
    (checked against gymnasium's above), apart from `shortest_path`'s own search."""
    table = transition_table(tuple(rows), slippery=False)
    goal, start = "".join(rows).index("G"), "".join(rows).index("S")
    steps, frontier = {start: 0}, [start]
    while frontier:
        following = []
        for state in frontier:
            for ((_, landing, _, _),) in table[state]:
                if landing not in steps and "".join(rows)[landing] != "H":
                    steps[landing] = steps[state] + 1
                    following.append(landing)
        frontier = following
    return steps.get(goal)


def walk(rows, path) -> list:
    env = FrozenLakeEnv(size=len(rows), slippery=False)
    env.load(rows, seed=0)
    return [env.step(action) for action in path]


def test_shortest_path_on_a_hand_checked_lake():
    # Holes at (1,0), (1,1), (2,1), (2,2), (3,0): right twice, down, around (2,2), down twice.
    assert shortest_path(SEED_0_MAP) == ["Right", "Right", "Down", "Right", "Down", "Down"]
    assert shortest_path(("SH", "HG")) is None


@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("random_ends", [False, True])
def test_shortest_path_walks_to_the_goal_over_no_hole_in_the_fewest_steps(size, random_ends):
    for seed in range(50):
        rows = generate_map(seed, size, random_ends=random_ends)
        path = shortest_path(rows)
        results = walk(rows, path)
        assert len(path) == shortest_length(rows)
        assert results[-1].info["success"] and not any(r.terminated for r in results[:-1])


def test_demonstrations_are_worked_first_turns_of_two_unplayed_lakes():
    env = envs.make("frozen-lake")
    demos = env.demonstrations()
    assert [d.observation for d in demos] == ["PO__\n____\n_O__\n___G", "P___\nO___\nO___\n_O_G"]
    assert [d.thought for d in demos] == [
        "The goal G is 3 below and 3 right of me. A hole O is 1 right of me, so I go Down.",
        "The goal G is 3 below and 3 right of me. A hole O is 1 below me, so I go Right.",
    ]
    assert [d.answer for d in demos] == [
        ("Down", "Down", "Down", "Right", "Right", "Right"),
        ("Right", "Down", "Down", "Right", "Down", "Right"),
    ]
    assert all(d.instructions == env.instructions() for d in demos)


@pytest.mark.parametrize("name", ["frozen-lake", "frozen-lake-8x8"])
def test_each_demonstration_follows_a_shortest_hole_free_path_of_its_lake(name):
    demos = envs.make(name).demonstrations()
    assert len(demos) == 2
    assert demos[0].answer[0] != demos[1].answer[0]  # no fixed first action to copy
    for seed, demo in zip((2_000_000_001, 2_000_000_016), demos, strict=True):
        played = envs.make(name)
        assert played.reset(seed) == demo.observation
        results = walk(played.rows, demo.answer)
        assert len(demo.answer) == shortest_length(played.rows)
        assert results[-1].info["success"] and not any(r.terminated for r in results[:-1])


def test_a_spaced_lake_is_the_same_lake_and_walk_with_a_space_between_cells():
    plain, spaced = FrozenLakeEnv(), FrozenLakeEnv(spaced=True)
    for seed in range(10):
        assert spaced.reset(seed) == "\n".join(" ".join(r) for r in plain.reset(seed).splitlines())
        for action in ("Down", "Right", "Down", "Right", "Down", "Right"):
            a, b = plain.step(action), spaced.step(action)
            assert (b.reward, b.terminated, b.observation.replace(" ", "")) == (
                a.reward,
                a.terminated,
                a.observation,
            )
            if a.terminated:
                break
    assert [d.observation for d in spaced.demonstrations()] == [
        "\n".join(" ".join(row) for row in d.observation.splitlines())
        for d in plain.demonstrations()
    ]


def test_the_thoughts_place_the_goal_and_holes_from_wherever_the_start_is():
    rows = ("FHF", "HSF", "GFF")  # start in the middle: holes above and left, goal 1 down-left
    assert holes_beside(rows, 4) == "Holes O are 1 left of me and 1 above me."
    assert holes_beside(rows, 8) == "No hole is beside me."
    assert holes_beside(rows, 2) == "A hole O is 1 left of me."
    assert _demo_thought(rows, "Down") == (
        "The goal G is 1 below and 1 left of me. Holes O are 1 left of me and 1 above me, "
        "so I go Down."
    )


@pytest.mark.parametrize("size", [4, 8])
def test_random_end_demonstrations_walk_their_own_lakes_from_no_fixed_first_move(size):
    demos = FrozenLakeEnv(size, random_ends=True).demonstrations()
    assert demos[0].answer[0] != demos[1].answer[0]
    for seed, demo in zip((2_000_000_002, 2_000_000_018), demos, strict=True):
        played = FrozenLakeEnv(size, random_ends=True)
        assert played.reset(seed) == demo.observation
        results = walk(played.rows, demo.answer)
        assert len(demo.answer) == shortest_length(played.rows)
        assert results[-1].info["success"] and not any(r.terminated for r in results[:-1])


def test_positions_place_the_player_goal_and_holes_by_row_and_column_from_one():
    rows = ("FHF", "HSF", "GFF")
    assert describe_positions(rows, 4) == (
        "You are at row 2, column 2. The goal G is at row 3, column 1. "
        "Holes O are at: row 1, column 2; row 2, column 1."
    )
    assert describe_positions(("SH", "FG"), 2) == (
        "You are at row 2, column 1. The goal G is at row 2, column 2. "
        "A hole O is at row 1, column 2."
    )
    assert describe_positions(("SF", "FG"), 3).endswith("There is no hole.")
    assert draw(rows, 4, spaced=True, positions=True) == (
        "_ O _\nO P _\nG _ _\n" + describe_positions(rows, 4)
    )


def test_a_lake_with_positions_follows_the_player_and_draws_the_same_lake_above():
    plain, placed = FrozenLakeEnv(spaced=True), FrozenLakeEnv(spaced=True, positions=True)
    first = placed.reset(0)
    assert first == plain.reset(0) + "\n" + describe_positions(SEED_0_MAP, 0)
    for action in ("Right", "Right", "Down", "Left"):
        seen, expected = placed.step(action), plain.step(action)
        assert seen.observation.startswith(expected.observation + "\nYou are at ")
        row, col = divmod(placed.state, 4)
        assert f"You are at row {row + 1}, column {col + 1}." in seen.observation
        if seen.terminated:
            break


def test_with_positions_the_worked_turns_give_rows_and_columns_in_their_thoughts():
    rows = ("FHF", "HSF", "GFF")
    assert _demo_thought(rows, "Down", located=True) == (
        "I am at row 2, column 2. The goal G is at row 3, column 1, 1 below and 1 left of me. "
        "Holes O are 1 left of me and 1 above me, so I go Down."
    )
    for demo in FrozenLakeEnv(random_ends=True, positions=True).demonstrations():
        assert "\nYou are at row " in demo.observation
        assert demo.thought.startswith("I am at row ")


def test_offsets_say_where_the_goal_and_the_holes_beside_lie_from_the_player():
    rows = ("FHF", "HSF", "GFF")
    assert describe_offsets(rows, 4) == (
        "The goal G is 1 below and 1 left of you. Holes O are 1 left of you and 1 above you."
    )
    assert describe_offsets(rows, 8) == "The goal G is 2 left of you. No hole is beside you."
    assert describe_offsets(rows, 6) == "A hole O is 1 above you."  # on the goal: holes only
    assert draw(rows, 4, spaced=True, positions=True, offsets=True) == "\n".join(
        ["_ O _\nO P _\nG _ _", describe_positions(rows, 4), describe_offsets(rows, 4)]
    )


def test_with_offsets_the_relative_thought_is_the_lines_words_about_me():
    env = FrozenLakeEnv(random_ends=True, spaced=True, offsets=True)
    for seed in range(30):
        said = env.reset(seed).splitlines()[-1]
        assert expert_move(env, 2, 10).thought.startswith(said.replace("you", "me"))
    for demo in env.demonstrations():
        said = demo.observation.splitlines()[-1]
        assert demo.thought.startswith(said.replace("you", "me").removesuffix("."))


def test_edges_name_the_sides_of_the_lake_beside_the_player():
    rows = ("FHF", "HSF", "GFF")
    assert edges_beside(3, 4, "you") == "No edge is beside you."
    assert edges_beside(3, 1) == "The edge is above me."
    assert edges_beside(3, 8, "you") == "Edges are below you and right of you."
    assert edges_beside(3, 0) == "Edges are left of me and above me."
    assert draw(rows, 8, offsets=True, edges=True).splitlines()[-1] == (
        "The goal G is 2 left of you. No hole is beside you. Edges are below you and right of you."
    )
    assert draw(rows, 4, edges=True).splitlines()[-1] == "No edge is beside you."


def test_the_careful_thought_says_what_the_observation_says_of_the_edges():
    env = FrozenLakeEnv(random_ends=True, spaced=True, offsets=True, edges=True)
    for seed in range(30):
        said = env.reset(seed).splitlines()[-1]
        thought = expert_move(env, 1, 10, lake="careful").thought
        assert thought.startswith(said.replace("you", "me"))


def test_coord_renders_ragen2s_coordinate_block_above_the_lake():
    # RAGEN-2's own example (map SFFF/FHFF/FFFH/HFFG), byte for byte: the header spaces too.
    env = envs.make("frozen-lake", coord=True)
    assert env.load(("SFFF", "FHFF", "FFFH", "HFFG"), 0) == (
        "Coordinates: \n"
        "Board size: 4 rows x 4 cols (zero-indexed).\n"
        "Start: (0, 0)\n"
        "Goal: (3, 3)\n"
        "Player: (0, 0)\n"
        "Holes: (1, 1), (2, 3), (3, 0)\n"
        "Grid Map: \n"
        "P___\n_O__\n___O\nO__G"
    )
    assert "Coordinates are (row, col), counted from (0, 0) at the top-left." in (
        env.instructions()
    )
    assert "Coordinates" not in envs.make("frozen-lake").instructions()


@pytest.mark.parametrize(
    ("rows", "action", "line"),
    [
        (("SG", "FF"), "Right", "Player on goal: (0, 1)"),  # no slip on this lake
        (("SH", "FG"), "Right", "Player in hole: (0, 1)"),
    ],
)
def test_coord_names_the_player_by_the_tile_under_it(rows, action, line):
    env = envs.make("frozen-lake", coord=True, slippery=False, spaced=True, offsets=True)
    env.load(rows, 0)
    observation = env.step(action).observation
    assert line in observation.splitlines()
    # the other options still draw as before, under the block
    assert observation.endswith(draw(rows, 1, spaced=True, offsets=True))
    holes = "Holes: (0, 1)" in observation
    assert holes == ("H" in "".join(rows))
