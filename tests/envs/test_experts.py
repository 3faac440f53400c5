import functools
import re

import pytest

from ragen import envs
from ragen.envs.countdown import evaluate
from ragen.envs.experts import (
    SCAN_ORDER,
    ExpertError,
    careful_move,
    expert_move,
    goal_probabilities,
    has_expert,
    lake_plan,
    policy_success,
    turn_play_success,
)
from ragen.envs.frozen_lake import (
    ACTIONS,
    SIDE_KINDS,
    generate_map,
    side_kinds,
    toward_goal,
    transition_table,
)
from ragen.envs.sokoban_levels import solve
from ragen.envs.sokoban_room import Room

SEEDS = range(40)


def _play(env, seed, per_turn, budget):
    """Expert episode on ``seed``: (success, moves played, turns)."""
    env.reset(seed)
    left, turns, played = budget, [], []
    while left > 0:
        move = expert_move(env, per_turn, left)
        assert 1 <= len(move.answer) <= min(per_turn, left)
        turns.append(move)
        for action in move.answer:
            result = env.step(action)
            left -= 1
            played.append(action)
            if result.terminated:
                return result.info["success"], played, turns
    return False, played, turns


@pytest.mark.parametrize("name", ["sokoban", "sokoban-newvocab", "sokoban-large"])
def test_sokoban_expert_replays_a_shortest_solution_to_success(name):
    for seed in SEEDS:
        env = envs.make(name)
        env.reset(seed)
        shortest = solve(env.room)
        success, played, turns = _play(env, seed, per_turn=2, budget=len(shortest))
        assert success and played == shortest, seed
        assert all(len(t.answer) == 2 for t in turns[:-1])


def test_sokoban_thought_is_true_of_the_state():
    # The box is down-right of the player; the target two right of the box's row below.
    room = Room.from_text("######\n#P___#\n#_X__#\n#___O#\n######")
    assert solve(room) == ["Down", "Right", "Right", "Up", "Right", "Down"]
    env = envs.make("sokoban")
    env.load(room)
    move = expert_move(env, 2, 10)
    assert move.answer == ("Down", "Right")
    assert move.thought == (
        "The box X is 1 below and 1 right of me. The target O is 1 below and 2 right of it. "
        "It takes 6 more moves. I step left of the box and push it Right."
    )
    # Another state, another thought: standing above the box, the plan is to push it down.
    env.step("Right")
    move = expert_move(env, 2, 9)
    assert move.answer == ("Down", "Left")
    assert move.thought == (
        "The box X is 1 below me. The target O is 1 below and 2 right of it. It takes 5 more "
        "moves. I push the box Down."
    )


def _cells(thought: str, width: int) -> list[int]:
    """The cells a located thought names, in order ("row R, column C", 1-based)."""
    found = re.findall(r"row (\d+), column (\d+)", thought)
    return [(int(row) - 1) * width + int(col) - 1 for row, col in found]


def test_a_located_sokoban_thought_gives_true_rows_and_columns_then_the_relative_one():
    room = Room.from_text("######\n#P___#\n#_X__#\n#___O#\n######")
    env = envs.make("sokoban", spaced=True)
    env.load(room)
    move = expert_move(env, 2, 10, "located")
    assert move.answer == ("Down", "Right")
    assert move.thought == (
        "I am at row 2, column 2. The box X is at row 3, column 3, 1 below and 1 right of me. "
        "The target O is at row 4, column 5, 1 below and 2 right of it. It takes 6 more "
        "moves. I step left of the box and push it Right."
    )


@pytest.mark.parametrize("name", ["sokoban", "sokoban-large"])
def test_located_sokoban_thoughts_name_the_player_a_box_and_a_target_on_every_seed(name):
    for seed in SEEDS:
        env = envs.make(name)
        env.reset(seed)
        room = env.room
        relative = expert_move(env, 2, 10).thought
        located = expert_move(env, 2, 10, "located")
        player, box, target = _cells(located.thought, room.width)
        assert (player, box in room.boxes, target in room.targets) == (room.player, True, True)
        # Without the rows and columns, the located thought says what the relative one says.
        plain = re.sub(r"I am at row \d+, column \d+\. ", "", located.thought)
        assert re.sub(r"at row \d+, column \d+, ", "", plain) == relative


def test_a_located_lake_thought_gives_my_cell_and_the_goals():
    env = envs.make("frozen-lake")
    env.load(("SHFF", "FFFF", "FFFF", "FFFG"), 0)
    move = expert_move(env, 2, 10, "located")
    assert move.thought.startswith(
        "I am at row 1, column 1. The goal G is at row 4, column 4, 3 below and 3 right of me. "
        "A hole O is 1 right"
    )
    assert move.answer == expert_move(env, 2, 10).answer
    with pytest.raises(ValueError, match="thought must be one of relative, located; got 'x'"):
        expert_move(env, 2, 10, "x")


def test_sokoban_expert_refuses_a_dead_room():
    env = envs.make("sokoban")
    env.load(Room.from_text("#####\n#X__#\n#P_O#\n#####"))  # the box sits in a corner
    with pytest.raises(ExpertError, match="cannot be solved"):
        expert_move(env, 2, 10)


def test_goal_probabilities_by_hand():
    # S F / F G on a lake that does not slip: one move short of the goal from S.
    rows = ("SF", "FG")
    values = goal_probabilities(transition_table(rows, slippery=False), 2)
    assert values[1] == [0.0, 1.0, 1.0, 0.0]
    assert values[2] == [1.0, 1.0, 1.0, 0.0]
    # Slippery: from S (cell 0) one action reaches G never; from F (cell 1), Down reaches G
    # w.p. 1/3 and both sideways slips (Left to S, Right into the edge) stay on the ice.
    slippery = goal_probabilities(transition_table(rows, slippery=True), 2)
    assert slippery[1][0] == 0.0
    assert slippery[1][1] == pytest.approx(1 / 3)
    # Two actions from S: e.g. Right then Down. Right lands on F (1/3), or slips Up (stays
    # at S, 1/3) or Down (to the other F, 1/3); from either F one more action is worth 1/3.
    assert slippery[2][0] == pytest.approx(2 / 3 * 1 / 3)


def test_lake_plan_matches_value_iteration_when_it_has_one_move():
    rows = ("SFFF", "FHFH", "FFFH", "HFFG")
    values = goal_probabilities(transition_table(rows), 10)
    for state in (0, 4, 8, 9, 10, 14):
        plan, probability = lake_plan(rows, state, 1, 10)
        assert probability == pytest.approx(values[10][state], abs=1e-12)
        assert len(plan) == 1


def test_lake_plan_probability_is_the_frequency_of_success():
    """The plan's stated probability against 3,000 played episodes (the env's own slips)."""
    rows = ("SFFF", "FHFH", "FFFH", "HFFG")
    plan, probability = lake_plan(rows, 0, 2, 10)
    replan = functools.cache(lake_plan)  # a pure function of a few (state, left) pairs here
    env = envs.make("frozen-lake")
    wins = 0
    for seed in range(3000):
        env.load(rows, seed)
        left, done = 10, False
        moves = plan  # the first turn plays the plan, later turns replan from the state
        while not done and left:
            for action in moves:
                result = env.step(action)
                left, done = left - 1, result.terminated
                if done:
                    wins += result.info["success"]
                    break
            if not done and left:
                moves = replan(rows, env.state, min(2, left), left)[0]
    # 3,000 episodes: standard error about 0.009 around probability ~0.3
    assert wins / 3000 == pytest.approx(probability, abs=0.035)


def test_lake_thought_names_the_goal_and_the_holes_beside_me():
    env = envs.make("frozen-lake")
    env.load(("SHFF", "FFFF", "FFFF", "FFFG"), 0)
    move = expert_move(env, 2, 10)
    assert move.thought.startswith("The goal G is 3 below and 3 right of me. A hole O is 1 right")
    assert " then ".join(move.answer) in move.thought
    assert "chance to reach it in the 10 actions left." in move.thought


def test_bandit_expert_pulls_the_arm_with_the_higher_mean():
    for name, arm in (("bandit", "Dragon"), ("bandit-rev", "Phoenix"), ("bandit-test", "Trader")):
        env = envs.make(name)
        env.reset(3)
        assert expert_move(env, 1, 1).answer == (arm,)
    safe = envs.make("bandit", low_payoff=0.5)  # 0.25 x 1 < 0.5: the sure arm wins
    safe.reset(0)
    move = expert_move(safe, 1, 1)
    assert move.answer == ("Phoenix",) and "the safe arm" in move.thought


def test_countdown_expert_answers_the_known_expression():
    env = envs.make("countdown")
    for seed in SEEDS:
        env.reset(seed)
        move = expert_move(env, 1, 1)
        (answer,) = move.answer
        assert evaluate(answer).value == env.instance.target
        assert env.step(answer).info["success"]


def test_every_registered_env_has_an_expert_and_others_are_refused():
    assert all(has_expert(envs.make(name)) for name in envs.names())

    class Other:
        actions = ("A",)

    assert not has_expert(Other())
    with pytest.raises(ExpertError, match="no expert plays Other"):
        expert_move(Other(), 1, 1)
    with pytest.raises(ValueError, match="needs an action"):
        expert_move(envs.make("bandit"), 1, 0)


def test_on_a_lake_with_positions_a_located_thought_copies_the_cells_the_lake_gives():
    env = envs.make("frozen-lake", random_ends=True, spaced=True, positions=True)
    for seed in SEEDS:
        observation = env.reset(seed)
        given = re.search(
            r"You are at (row \d+, column \d+)\. The goal G is at (row \d+, column \d+)\.",
            observation,
        )
        thought = expert_move(env, 2, 10, "located").thought
        assert given is not None
        assert thought.startswith(f"I am at {given[1]}. The goal G is at {given[2]}, ")


def test_policy_success_of_uniform_and_fixed_play_by_hand():
    # Goal right of the start: on the slippery ice every action but Left slides Right w.p.
    # 1/3, so one uniform action reaches it w.p. 3/4 * 1/3 = 1/4 and Right alone w.p. 1/3;
    # the optimal policy is no better than Right within one action.
    table = transition_table(("SG", "FF"), True)
    uniform = [[0.25] * 4] * 4
    right = [[0.0, 0.0, 1.0, 0.0]] * 4
    assert policy_success(table, uniform, 1)[1][0] == pytest.approx(1 / 4)
    assert policy_success(table, right, 1)[1][0] == pytest.approx(1 / 3)
    assert goal_probabilities(table, 1)[1][0] == pytest.approx(1 / 3)
    # On ice that does not slip, Right reaches it at once and Down never does.
    still = transition_table(("SG", "FF"), False)
    assert policy_success(still, right, 3)[3][0] == 1.0
    assert policy_success(still, [[0.0, 1.0, 0.0, 0.0]] * 4, 3)[3][0] == 0.0


@pytest.mark.parametrize(
    ("rows", "moves", "thought"),
    [
        (
            ("SHFF", "FFFF", "FFFF", "FFFG"),
            ("Down", "Down"),
            "The goal G is 3 below and 3 right of me. 3 below is as far as 3 right, and on a "
            "tie I go up or down, so I go Down then Down.",
        ),
        (
            ("FFFF", "FFGF", "FFFF", "FSFF"),
            ("Up", "Up"),
            "The goal G is 2 above and 1 right of me. 2 above is farther than 1 right, so I go "
            "Up then Up.",
        ),
        (
            ("FFFF", "FFFF", "FFFF", "GFFS"),
            ("Left", "Left"),
            "The goal G is 3 left of me. It is in line with me, so I go Left then Left.",
        ),
        (
            ("FFFF", "SFFF", "FFFG", "FFFF"),
            ("Right", "Right"),
            "The goal G is 1 below and 3 right of me. 3 right is farther than 1 below, so I "
            "go Right then Right.",
        ),
    ],
)
def test_the_toward_lake_expert_repeats_the_move_along_the_larger_offset(rows, moves, thought):
    env = envs.make("frozen-lake")
    env.load(rows, 0)
    move = expert_move(env, 2, 10, lake="toward")
    assert (move.answer, move.thought) == (moves, thought)
    assert expert_move(env, 2, 1, lake="toward").answer == moves[:1]  # one action left
    located = expert_move(env, 2, 10, "located", lake="toward").thought
    assert located.startswith("I am at row ") and located.endswith(thought.split(". ", 1)[1])
    with pytest.raises(
        ValueError,
        match="lake must be one of optimal, toward, careful, sides, ranked, scan; got 'x'",
    ):
        expert_move(env, 2, 10, lake="x")


def test_toward_lake_play_scores_what_its_policy_is_worth():
    """Played as the expert plays it (two open-loop moves a turn, five turns), the toward
    expert's success on a lake against the exact probability of that play, over 3,000
    slippery episodes; and below the optimal plan's."""
    rows = ("FFFH", "FHFF", "SFFF", "HFFG")
    table = transition_table(rows)
    start = "".join(rows).index("S")
    goal = "".join(rows).index("G")
    exact = turn_play_success(
        table, start, lambda cell, left: [toward_goal(goal, cell, len(rows))] * 2, 5, 2
    )
    env, wins = envs.make("frozen-lake"), 0
    for seed in range(3000):
        env.load(rows, seed)
        left, done = 10, False
        while not done and left:
            for action in expert_move(env, 2, left, lake="toward").answer:
                result = env.step(action)
                left, done = left - 1, result.terminated
                if done:
                    wins += result.info["success"]
                    break
    assert wins / 3000 == pytest.approx(exact, abs=0.03)  # SE about 0.009
    assert exact < goal_probabilities(table, 10)[10][start]


def test_turn_play_success_by_hand():
    # Cells 0 S, 1 G / 2 F, 3 F. Right slides Up or Down w.p. 1/3 each. From S, Right reaches
    # G w.p. 1/3, stays on S (slid Up into the edge) w.p. 1/3, or lands on cell 2 w.p. 1/3.
    # The turn's second Right reaches G w.p. 1/3 from S and never from cell 2 (it lands on
    # 3, slides Up to S or Down into the edge).
    table = transition_table(("SG", "FF"))
    assert turn_play_success(table, 0, lambda cell, left: ["Right", "Right"], 1, 2) == (
        pytest.approx(1 / 3 + 1 / 3 * 1 / 3)
    )
    # After that turn the player is on S w.p. 2/9, on cell 2 w.p. 2/9, on cell 3 w.p. 1/9.
    # A second turn wins 4/9 from S; 2/9 from cell 2 (to 3 then Up, or to S then Right); 5/9
    # from cell 3 (Up on the first action, or on the second after staying w.p. 2/3).
    second = 2 / 9 * 4 / 9 + 2 / 9 * 2 / 9 + 1 / 9 * 5 / 9
    assert turn_play_success(table, 0, lambda cell, left: ["Right", "Right"], 2, 2) == (
        pytest.approx(4 / 9 + second)
    )


@pytest.mark.parametrize(
    ("rows", "thought"),
    [
        # Down (1/3 each: below, left into the edge, right) is the one move no slip takes
        # into the hole above; it lands (2 + 3 + 2) / 3 steps from the goal on average.
        (
            ("HFF", "SFF", "FFG"),
            "The goal G is 1 below and 2 right of me. A hole O is 1 above me. Down cannot slip "
            "into a hole and lands nearest the goal, so I go Down then Down.",
        ),
        # Holes left and above: Left and Up fall 2/3 of the time, Down and Right 1/3, both
        # landing 5/3 steps from the goal on average; Down comes first in ACTIONS order.
        (
            ("FHF", "HSF", "FFG"),
            "The goal G is 1 below and 1 right of me. Holes O are 1 left of me and 1 above me. "
            "Every move can slip into a hole; Down risks it least, so I go Down then Down.",
        ),
    ],
)
def test_the_careful_lake_expert_keeps_off_the_holes_beside(rows, thought):
    env = envs.make("frozen-lake")
    env.load(rows, 0)
    move = expert_move(env, 2, 10, lake="careful")
    assert (move.answer, move.thought) == (("Down", "Down"), thought)
    assert expert_move(env, 1, 10, lake="careful").answer == ("Down",)
    located = expert_move(env, 2, 10, "located", lake="careful").thought
    assert located.startswith("I am at row 2, ") and located.endswith(thought.split(". ", 2)[2])


def test_careful_lake_play_scores_what_its_policy_is_worth():
    """One careful move a turn for ten turns, played on the slippery lake 3,000 times, against
    the exact probability of that play; it beats walking toward the goal on this lake."""
    rows = ("FFFH", "FHFF", "SFFF", "HFFG")
    table = transition_table(rows)
    start, goal = "".join(rows).index("S"), "".join(rows).index("G")
    exact = turn_play_success(table, start, lambda c, left: [careful_move(rows, table, c)], 10, 1)
    toward = turn_play_success(
        table, start, lambda c, left: [toward_goal(goal, c, len(rows))], 10, 1
    )
    env, wins = envs.make("frozen-lake"), 0
    for seed in range(3000):
        env.load(rows, seed)
        for left in range(10, 0, -1):
            result = env.step(expert_move(env, 1, left, lake="careful").answer[0])
            if result.terminated:
                wins += result.info["success"]
                break
    assert wins / 3000 == pytest.approx(exact, abs=0.03)  # SE about 0.009
    assert exact > toward


@pytest.mark.parametrize(
    ("lake", "rows", "thought"),
    [
        # The careful lake above: the edge left, Down and Right one step nearer the goal,
        # the hole above; Down turns its back on the hole.
        (
            "sides",
            ("HFF", "SFF", "FFG"),
            "The goal G is 1 below and 2 right of me. Left wall, Down toward, Right toward, "
            "Up hole. Worst is Up; a slip never goes back, so I go Down.",
        ),
        # The goal straight above the bottom row: Up's slips go Left or Right, both a step
        # away, (1 + 3 + 3) / 3 from the goal on average; Left's go Up or into the edge
        # below, where the player stays, (3 + 1 + 2) / 3. Left and Right tie; Left comes
        # first in ACTIONS order, so Right is the side named worst.
        (
            "sides",
            ("FGF", "FFF", "FSF"),
            "The goal G is 2 above me. Left away, Down wall, Right away, Up toward. Worst is "
            "Right; a slip never goes back, so I go Left.",
        ),
        # The scan thought (sides in SCAN_ORDER, a tie to the first listed): Left and Right
        # tie as steps away, Left is listed first, so it is the worst.
        (
            "scan",
            ("FGF", "FFF", "FSF"),
            "The goal G is 2 above me. Down wall, Up toward, Left away, Right away. Hole: none. "
            "Away: Left, Right. Worst is Left; a slip never goes back, so I go Right.",
        ),
        # The two edges of the corner tie: Up comes before Left.
        (
            "scan",
            ("SFF", "FFF", "FFG"),
            "The goal G is 2 below and 2 right of me. Down toward, Up wall, Left wall, Right "
            "toward. Hole: none. Away: none. Wall: Up, Left. Worst is Up; a slip never goes "
            "back, so I go Down.",
        ),
    ],
)
def test_the_sides_lake_experts_move_opposite_the_worst_side(lake, rows, thought):
    env = envs.make("frozen-lake")
    env.load(rows, 0)
    move = expert_move(env, 1, 10, lake=lake)
    assert (move.thought, move.answer) == (thought, (thought.rsplit(" ", 1)[1][:-1],))
    scan = SCAN_ORDER if lake == "scan" else None
    assert move.answer == (careful_move(rows, transition_table(rows), env.state, scan),)
    if lake == "sides":
        assert move.answer == expert_move(env, 1, 10, lake="careful").answer
    assert expert_move(env, 2, 10, lake=lake).answer == move.answer * 2
    located = expert_move(env, 1, 10, "located", lake=lake).thought
    assert located.startswith("I am at row ") and located.endswith(thought.split(". ", 1)[1])


def test_the_careful_move_is_always_opposite_a_worst_side():
    """On every open cell of 300 random slippery lakes (4x4 and 6x6, random ends), the side
    behind `careful_move` ranks worst by SIDE_KINDS: the rule the sides thought states picks
    the careful move, ties included."""
    cells = 0
    for seed in range(150):
        for size in (4, 6):
            rows = generate_map(seed, size, random_ends=True)
            table, tiles = transition_table(rows), "".join(rows)
            for cell, tile in enumerate(tiles):
                if tile in "GH":
                    continue
                ranks = [SIDE_KINDS.index(kind) for kind in side_kinds(rows, cell)]
                move = ACTIONS.index(careful_move(rows, table, cell))
                assert ranks[(move + 2) % 4] == max(ranks), (rows, cell)
                cells += 1
    assert cells > 4000


@pytest.mark.parametrize(
    ("rows", "ranking"),
    [
        # The hole above is the only kind worse than a step toward: the list stops there.
        (("HFF", "SFF", "FFG"), "Hole: Up."),
        # Left and Right tie as steps away; Right, the side behind Left (first in ACTIONS
        # order), is named first, as the sides thought names it worst.
        (("FGF", "FFF", "FSF"), "Hole: none. Away: Right, Left."),
        # In the corner: no hole, no step away; the edges above and left, the one behind
        # Down (the goal's larger offset on a tie, vertical) first.
        (("SFF", "FFF", "FFG"), "Hole: none. Away: none. Wall: Up, Left."),
    ],
)
def test_the_ranked_thought_lists_the_worst_kinds_sides_before_naming_the_worst(rows, ranking):
    env = envs.make("frozen-lake")
    env.load(rows, 0)
    sides = expert_move(env, 1, 10, lake="sides")
    ranked = expert_move(env, 1, 10, lake="ranked")
    head, tail = sides.thought.split(" Worst is ")
    assert ranked.thought == f"{head} {ranking} Worst is {tail}"
    assert ranked.answer == sides.answer


@pytest.mark.parametrize("lake", ["ranked", "scan"])
def test_the_ranked_thoughts_first_name_of_the_worst_kind_is_the_worst_side(lake):
    """From every open cell of 100 random slippery 4x4 lakes: the ranking lists each kind's
    sides exactly, down to the first kind held, and its last list opens with the worst; the
    scan thought's worst, unless a hole, is the first side of its kind in SCAN_ORDER."""
    env = envs.make("frozen-lake")
    cells = 0
    for seed in range(100):
        rows = generate_map(seed, 4, random_ends=True)
        tile_row = "".join(rows)
        for cell, tile in enumerate(tile_row):
            if tile in "GH":
                continue
            tiles = ["S" if i == cell else "F" if t == "S" else t for i, t in enumerate(tile_row)]
            env.load(["".join(tiles[i : i + 4]) for i in range(0, 16, 4)], 0)
            thought = expert_move(env, 1, 10, lake=lake).thought
            kinds = side_kinds(rows, cell)
            lists = re.findall(r"(Hole|Away|Wall): ([A-Za-z, ]+)\.", thought)
            for label, names in lists:
                held = {ACTIONS[i] for i, kind in enumerate(kinds) if kind == label.lower()}
                assert set(names.split(", ")) - {"none"} == held, (rows, cell, thought)
            assert [label for label, _ in lists][-1] == max(kinds, key=SIDE_KINDS.index).title()
            worst = re.search(r"Worst is (\w+);", thought).group(1)
            assert lists[-1][1].split(", ")[0] == worst
            worst_kind = lists[-1][0].lower()
            if lake == "scan" and worst_kind != "hole":
                assert worst == next(s for s in SCAN_ORDER if kinds[ACTIONS.index(s)] == worst_kind)
            cells += 1
    assert cells > 900


@pytest.mark.parametrize("lake", ["sides", "ranked", "scan"])
def test_the_sides_experts_refuse_a_lake_that_does_not_slip(lake):
    env = envs.make("frozen-lake", slippery=False)
    env.reset(0)
    with pytest.raises(ExpertError, match="reasons about slips"):
        expert_move(env, 1, 10, lake=lake)
