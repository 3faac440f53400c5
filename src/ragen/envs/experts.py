"""Expert play: the move a perfect player makes from an env's current state, with a thought.

`expert_move(env, max_actions, actions_left)` reads the state through each env's public
attributes and returns the actions of one turn and a short thought that is true of this
state (where the player, box, target, goal or holes are, and why these moves), so that
supervised fine-tuning on expert dialogues (`ragen sft`) teaches reasoning that varies with
the state instead of a fixed template. On the grid games the thought places things relative
to one another ("the box X is 1 left of me"), or with ``thought="located"`` first gives each
one's row and column, counted from 1 at the top-left ("I am at row 2, column 4. The box X is
at row 2, column 3, 1 left of me."): a step a model can check against the grid before it
relates the two.

- Sokoban: the first moves of a shortest solution from the current room (`sokoban_levels.solve`).
  With ``sokoban="push"`` (rooms of one box), one move a turn of a rule that reads only what
  the ``offsets`` line writes out (`push_plan`): push the box along the target's larger
  offset from it, from the cell behind it; until there, step to a side that comes nearer
  that cell, else one aside, else one back, never into a wall or the box. A weaker player
  than the solver (docs/results/sokoban.md), but one whose every move follows from the text.
  ``sokoban="push_first"`` pushes along the offset the line names first (vertical while
  there is one): a choice a model copies rather than computes, and a little stronger.
- FrozenLake: the open-loop plan of the turn's moves that maximises the probability of
  reaching the goal within the actions left, under the known slippery dynamics (finite-
  horizon value iteration over the transition table); replanned each turn, after the slips.
  With ``lake="toward"``, the move along the goal's larger offset, repeated for the turn: a
  weaker player (`config.SftConfig.lake_expert`), but one whose move follows from where the
  goal lies, which a model can read off the lake. With ``lake="careful"``, the move least
  likely to slip into a hole beside, then the one landing nearest the goal on average,
  repeated for the turn: also a function of what the ``offsets`` line says. With
  ``lake="sides"``, the careful move with a thought that derives it: what each side holds
  (a hole, the edge, a step toward or away from the goal) and the move opposite the worst;
  ``lake="ranked"`` also lists the sides of each kind from the worst kind down first, and
  ``lake="scan"`` lists the sides in a fixed order, the tie going to the first listed.
- Bandit: the arm with the higher expected payoff.
- Countdown: the instance's known expression.
- Any other env that defines ``expert(limit, located) -> ExpertMove`` (a game module's own
  expert, or a plugin env's): its turn of at most ``limit`` actions.

Pure functions of the env's state: no model, no randomness.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragen.config import EXPERT_THOUGHTS, LAKE_EXPERTS, SOKOBAN_EXPERTS
from ragen.envs.bandit import BanditEnv
from ragen.envs.base import ExpertError, ExpertMove, grid_cell, relative_position
from ragen.envs.countdown import CountdownEnv
from ragen.envs.frozen_lake import ACTIONS as LAKE_ACTIONS
from ragen.envs.frozen_lake import (
    SIDE_KINDS,
    FrozenLakeEnv,
    edges_beside,
    goal_sentence,
    holes_beside,
    side_kinds,
    steps_to_goal,
    toward_goal,
    transition_table,
)
from ragen.envs.sokoban import ACTIONS as SOKOBAN_ACTIONS
from ragen.envs.sokoban import SokobanEnv
from ragen.envs.sokoban_levels import solve
from ragen.envs.sokoban_room import PUSH_FROM, SIDE_STEPS, Room, cell_distance, relative_cell

# Open-loop moves the lake expert plans in one turn: 4**k sequences are searched, and a
# move planned blind after three slippery ones is rarely better than the next turn's.
MAX_LAKE_PLAN = 3
# Plans whose success probabilities differ by less than this are ties (float noise).
_TIE = 1e-12


def has_expert(env) -> bool:
    """Whether `expert_move` can play this env."""
    builtin = isinstance(env, SokobanEnv | FrozenLakeEnv | BanditEnv | CountdownEnv)
    return builtin or callable(getattr(env, "expert", None))


def expert_move(
    env,
    max_actions: int,
    actions_left: int,
    thought: str = "relative",
    lake: str = "optimal",
    sokoban: str = "optimal",
) -> ExpertMove:
    """The expert's turn from `env`'s current state: at most `min(max_actions,
    actions_left)` actions (both >= 1); `thought` is one of `config.EXPERT_THOUGHTS`, `lake`
    (how FrozenLake is played) one of `config.LAKE_EXPERTS`, `sokoban` (how Sokoban is
    played) one of `config.SOKOBAN_EXPERTS`.

    Raises ExpertError for an env without an expert or a state it cannot move from.
    """
    if max_actions < 1 or actions_left < 1:
        raise ValueError(f"an expert turn needs an action: got {max_actions=}, {actions_left=}")
    if thought not in EXPERT_THOUGHTS:
        raise ValueError(f"thought must be one of {', '.join(EXPERT_THOUGHTS)}; got {thought!r}")
    if lake not in LAKE_EXPERTS:
        raise ValueError(f"lake must be one of {', '.join(LAKE_EXPERTS)}; got {lake!r}")
    if sokoban not in SOKOBAN_EXPERTS:
        raise ValueError(f"sokoban must be one of {', '.join(SOKOBAN_EXPERTS)}; got {sokoban!r}")
    limit, located = min(max_actions, actions_left), thought == "located"
    if isinstance(env, SokobanEnv):
        if sokoban in PUSH_EXPERTS:
            return _push_sokoban(env, first=sokoban == "push_first")
        return _sokoban(env, limit, located)
    if isinstance(env, FrozenLakeEnv):
        return _lake(env, limit, actions_left, located, lake)
    if isinstance(env, BanditEnv):
        return _bandit(env)
    if isinstance(env, CountdownEnv):
        return _countdown(env)
    if callable(getattr(env, "expert", None)):
        return env.expert(limit, located)
    raise ExpertError(
        f"no expert plays {type(env).__name__}: expert play exists for Sokoban, FrozenLake, "
        "Bandit and Countdown"
    )


# ----------------------------------------------------------------------------- Sokoban


def _sokoban(env: SokobanEnv, limit: int, located: bool) -> ExpertMove:
    room = env.room
    solution = solve(room)
    if not solution:
        raise ExpertError("this Sokoban room cannot be solved from its current state")
    moves = tuple(solution[:limit])
    return ExpertMove(_sokoban_thought(room, solution, moves, env.symbols, located), moves)


def _sokoban_thought(
    room: Room, solution: list[str], moves: tuple[str, ...], symbols, located: bool
) -> str:
    """Where the next box to push and its nearest target lie (`located`: their rows and
    columns first), how many moves the solution takes, and whether this turn walks to the
    box or pushes it."""
    offsets, player, walk = room.offsets(), room.player, 0
    for direction in solution:  # the first push of the solution; every solution has one
        ahead = player + offsets[direction]
        if ahead in room.boxes:
            break
        player, walk = ahead, walk + 1
    box, width = ahead, room.width
    target = min(room.targets, key=lambda t: (cell_distance(box, t, width), t))
    article = "The" if len(room.boxes) == 1 else "A"
    where_box = relative_cell(room.player, box, width, "me")
    where_target = relative_cell(box, target, width, "it")
    mine = ""
    if located:
        mine = f"I am at {grid_cell(room.player, width)}. "
        where_box = f"at {grid_cell(box, width)}, {where_box}"
        where_target = f"at {grid_cell(target, width)}, {where_target}"
    facts = (
        f"{mine}{article} box {symbols['box']} is {where_box}. "
        f"{article} target {symbols['target']} is {where_target}. "
    )
    total = len(solution)
    plan = f"It takes {total} more move{'s' if total != 1 else ''}."
    if walk == 0:
        act = f"I push the box {direction}."
    elif walk >= len(moves):
        act = f"I walk to the cell {PUSH_FROM[direction]} the box, to push it {direction}."
    else:
        act = f"I step {PUSH_FROM[direction]} the box and push it {direction}."
    return f"{facts}{plan} {act}"


PUSH_EXPERTS = ("push", "push_first")
"""The Sokoban experts of the push rule: they play rooms of one box."""

# What a step to each side does under the push rule, in the order it prefers them: nearer the
# cell behind the box; aside, along a line the player already shares with that cell (the way
# around a box or a wall in between); back, farther along the other line; into the box; into
# a wall. Stepping aside before back keeps the player from pacing back and forth.
PUSH_SIDE_KINDS = ("nearer", "aside", "back", "box", "wall")


@dataclass(frozen=True)
class PushPlan:
    """The push rule's reading of a one-box room (`push_plan`).

    push: the direction the box goes, along the target's larger offset from it (vertical on
    a tie), or with ``first`` the vertical one while there is one; behind: the cell the
    player pushes it from; kinds: per action (Up, Down, Left, Right) what a step there does,
    one of PUSH_SIDE_KINDS, empty once the player stands behind the box; move: the push from
    ``behind``, else the first side of the first kind.
    """

    push: str
    behind: int
    kinds: tuple[str, ...]
    move: str


def push_plan(room: Room, first: bool = False) -> PushPlan:
    """The push rule's move in ``room``, which must hold one box off its target. ``first``
    pushes along the offset the offsets line names first (the vertical one, while there is
    one) instead of the larger."""
    if len(room.boxes) != 1 or room.solved:
        raise ExpertError("the push expert plays a room of one box off its target")
    width, box, target = room.width, next(iter(room.boxes)), next(iter(room.targets))
    d_row, d_col = target // width - box // width, target % width - box % width
    if (d_row != 0) if first else abs(d_row) >= abs(d_col):
        push = "Down" if d_row > 0 else "Up"
    else:
        push = "Right" if d_col > 0 else "Left"
    behind = box - room.offsets()[push]
    if room.player == behind:
        return PushPlan(push, behind, (), push)
    to_row = behind // width - room.player // width
    to_col = behind % width - room.player % width
    kinds = []
    for step_row, step_col in SIDE_STEPS:
        near = room.player + step_row * width + step_col
        along = to_row if step_row else to_col  # the offset on this step's line
        if not room.floor[near]:
            kinds.append("wall")
        elif near == box:
            kinds.append("box")
        elif along * (step_row + step_col) > 0:
            kinds.append("nearer")
        else:
            kinds.append("back" if along else "aside")
    move = SOKOBAN_ACTIONS[min(range(len(kinds)), key=lambda i: PUSH_SIDE_KINDS.index(kinds[i]))]
    return PushPlan(push, behind, tuple(kinds), move)


def _push_sokoban(env: SokobanEnv, first: bool = False) -> ExpertMove:
    """One move of the push rule (``first``: along the offset named first), with a thought
    that derives it from the offsets line: "The target O is 2 above the box X, so I push the
    box Up, from the cell below it, 2 below me. Up back, Down box, Left aside, Right aside. I
    go Left." or, behind the box, "... from the cell below it, where I stand. I push Up."."""
    room, symbols = env.room, env.symbols
    plan = push_plan(room, first)
    box, target, width = next(iter(room.boxes)), next(iter(room.targets)), room.width
    head = (
        f"The target {symbols['target']} is {relative_cell(box, target, width, 'the box')} "
        f"{symbols['box']}, so I push the box {plan.push}, from the cell "
        f"{PUSH_FROM[plan.push]} it"
    )
    if not plan.kinds:
        return ExpertMove(f"{head}, where I stand. I push {plan.push}.", (plan.move,))
    sides = ", ".join(
        f"{side} {kind}" for side, kind in zip(SOKOBAN_ACTIONS, plan.kinds, strict=True)
    )
    where = relative_cell(room.player, plan.behind, width, "me")
    return ExpertMove(f"{head}, {where}. {sides}. I go {plan.move}.", (plan.move,))


# --------------------------------------------------------------------------- FrozenLake


def _lake(
    env: FrozenLakeEnv, limit: int, actions_left: int, located: bool, lake: str
) -> ExpertMove:
    """The turn of the FrozenLake expert ``lake`` (`config.LAKE_EXPERTS`)."""
    if lake == "toward":
        return _toward_lake(env, limit, located)
    if lake == "careful":
        return _careful_lake(env, limit, located)
    if lake in SIDES_EXPERTS:
        return _sides_lake(env, limit, located, lake)
    return _frozen_lake(env, limit, actions_left, located)


def goal_probabilities(table: tuple, horizon: int) -> list[list[float]]:
    """Finite-horizon value iteration: ``values[k][s]``, the highest probability of reaching
    the goal from state ``s`` within ``k`` actions (``values[0]`` is all 0).

    table: ``transition_table(rows, slippery)``; reaching the goal pays 1, so the expected
    return of an optimal policy is its success probability.
    """
    values = [[0.0] * len(table)]
    for _ in range(horizon):
        before = values[-1]
        values.append(
            [
                max(
                    sum(p * (reward + (0.0 if done else before[s])) for p, s, reward, done in acts)
                    for acts in outcomes
                )
                for outcomes in table
            ]
        )
    return values


def policy_success(table: tuple, policy: list[list[float]], horizon: int) -> list[list[float]]:
    """``values[k][s]``: the probability of reaching the goal from ``s`` within ``k`` actions
    when every action is drawn from ``policy[s]`` (four probabilities, in ACTIONS order): a
    fixed policy's counterpart of `goal_probabilities`, for baselines such as uniform play.
    """
    values = [[0.0] * len(table)]
    for _ in range(horizon):
        before = values[-1]
        values.append(
            [
                sum(
                    chance * p * (reward + (0.0 if done else before[s]))
                    for chance, acts in zip(policy[state], outcomes, strict=True)
                    for p, s, reward, done in acts
                )
                for state, outcomes in enumerate(table)
            ]
        )
    return values


def _goal_distances(rows: tuple[str, ...]) -> list[int]:
    """Hole-free steps from each cell to the goal (len(cells) where it is cut off)."""
    size = len(rows)
    cells = size * size
    tiles = "".join(rows)
    far = [cells] * cells
    goal = tiles.index("G")
    far[goal] = 0
    queue = deque([goal])
    while queue:
        cell = queue.popleft()
        row, col = divmod(cell, size)
        for d_row, d_col in ((0, -1), (1, 0), (0, 1), (-1, 0)):
            r, c = row + d_row, col + d_col
            near = r * size + c
            if 0 <= r < size and 0 <= c < size and tiles[near] != "H" and far[near] == cells:
                far[near] = far[cell] + 1
                queue.append(near)
    return far


def play_blind(
    table: tuple, belief: dict[int, float], plan: Sequence[int]
) -> tuple[float, dict[int, float]]:
    """The actions ``plan`` (indices in ACTIONS order) played without looking, from the
    distribution ``belief`` over cells: (the probability of reaching the goal on the way, the
    distribution over the cells still on the ice after them). An episode stops in a hole or
    at the goal."""
    reached = 0.0
    for action in plan:
        after: dict[int, float] = {}
        for s, p in belief.items():
            for q, nxt, reward, done in table[s][action]:
                reached += p * q * reward
                if not done:
                    after[nxt] = after.get(nxt, 0.0) + p * q
        belief = after
    return reached, belief


def turn_play_success(
    table: tuple,
    start: int,
    moves: Callable[[int, int], Sequence[str]],
    turns: int,
    per_turn: int,
) -> float:
    """The probability of reaching the goal from ``start`` when each of ``turns`` turns plays
    ``moves(cell, actions_left)`` (action names, ``per_turn`` of them) blind from the cell the
    turn starts on, as the expert plays a rollout's turns; exact, by `play_blind`."""
    belief, reached, left = {start: 1.0}, 0.0, turns * per_turn
    for _ in range(turns):
        after: dict[int, float] = {}
        for cell, p in belief.items():
            plan = [LAKE_ACTIONS.index(a) for a in moves(cell, left)]
            won, ice = play_blind(table, {cell: p}, plan)
            reached += won
            for s, q in ice.items():
                after[s] = after.get(s, 0.0) + q
        belief, left = after, left - per_turn
    return reached


def lake_plan(
    rows: tuple[str, ...], state: int, moves: int, actions_left: int, slippery: bool = True
) -> tuple[tuple[str, ...], float]:
    """The best open-loop sequence of ``moves`` actions from ``state`` and its probability of
    reaching the goal within ``actions_left`` actions (the later ones played optimally).

    Every sequence is scored exactly: its outcome distribution is propagated through the
    transition table (an episode that falls in a hole or reaches the goal stops there), then
    each state still on the ice is worth its optimal value with the actions that remain.
    Ties (equal probability, e.g. when the goal is out of reach) go to the plan that ends
    closest to the goal on average, then to the earlier actions in ACTIONS order.
    """
    table = transition_table(tuple(rows), slippery)
    values = goal_probabilities(table, actions_left)
    distance = _goal_distances(rows)
    best: tuple[int, ...] = ()
    best_key: tuple[int, float, tuple[int, ...]] | None = None
    best_success = 0.0
    for plan in itertools.product(range(len(LAKE_ACTIONS)), repeat=moves):
        reached, belief = play_blind(table, {state: 1.0}, plan)
        left = actions_left - moves
        success = reached + sum(p * values[left][s] for s, p in belief.items())
        on_ice = sum(belief.values())
        expected_distance = (
            sum(p * distance[s] for s, p in belief.items()) / on_ice if on_ice else 0
        )
        key = (-round(success / _TIE), expected_distance, plan)
        if best_key is None or key < best_key:
            best, best_key, best_success = plan, key, success
    return tuple(LAKE_ACTIONS[a] for a in best), best_success


def _frozen_lake(env: FrozenLakeEnv, limit: int, actions_left: int, located: bool) -> ExpertMove:
    rows, state = env.rows, env.state
    if not rows:
        raise ExpertError("the lake has no map yet: reset the env first")
    moves, probability = lake_plan(
        rows, state, min(limit, MAX_LAKE_PLAN), actions_left, env.slippery
    )
    goal = goal_sentence(rows, state, located=located)
    beside = holes_beside(rows, state)
    chance = f"{probability:.0%}" if probability > 0 else "no"
    unit = "action" if actions_left == 1 else "actions"
    plan = " then ".join(moves)
    reason = f"gives {chance} chance to reach it in the {actions_left} {unit} left."
    return ExpertMove(f"{goal} {beside} {plan} {reason}", moves)


def _toward_lake(env: FrozenLakeEnv, limit: int, located: bool) -> ExpertMove:
    """The move along the goal's larger offset (`frozen_lake.toward_goal`), `limit` times, and
    the thought that reads it off the offsets: "The goal G is 3 above and 2 left of me. 3
    above is farther than 2 left, so I go Up then Up."."""
    rows, state = env.rows, env.state
    if not rows:
        raise ExpertError("the lake has no map yet: reset the env first")
    size, goal = len(rows), "".join(rows).index("G")
    if state == goal:
        raise ExpertError("the player stands on the goal: the episode is over")
    (row, col), (goal_row, goal_col) = divmod(state, size), divmod(goal, size)
    move = toward_goal(goal, state, size)
    vertical = relative_position(goal_row - row, 0, "").strip()
    horizontal = relative_position(0, goal_col - col, "").strip().removesuffix(" of")
    if goal_row == row or goal_col == col:
        why = "It is in line with me"
    elif abs(goal_row - row) == abs(goal_col - col):
        why = f"{vertical} is as far as {horizontal}, and on a tie I go up or down"
    else:
        near, far = (horizontal, vertical) if move in ("Up", "Down") else (vertical, horizontal)
        why = f"{far} is farther than {near}"
    moves = (move,) * limit
    why = f"{why}, so I go {' then '.join(moves)}."
    return ExpertMove(f"{goal_sentence(rows, state, located=located)} {why}", moves)


def careful_cost(
    rows: tuple[str, ...], table: tuple, cell: int, action: int
) -> tuple[float, float]:
    """(the chance that ``action`` from ``cell`` slips into a hole, the mean steps along rows
    and columns from where it lands to the goal, holes ignored); rounded, as the slip
    probabilities are 1/3 in floats that do not add up exactly. table: ``transition_table``."""
    size, tiles = len(rows), "".join(rows)
    goal = tiles.index("G")
    outcomes = table[cell][action]
    fall = sum(p for p, to, _, _ in outcomes if tiles[to] == "H")
    distance = sum(p * steps_to_goal(size, goal, to) for p, to, _, _ in outcomes)
    return round(fall, 9), round(distance, 9)


def careful_move(
    rows: tuple[str, ...], table: tuple, cell: int, scan: Sequence[str] | None = None
) -> str:
    """The action least likely to slip into a hole, then the one whose outcomes lie nearest the
    goal on average, then `toward_goal`'s move, then the earlier in ACTIONS order: a rule that
    reads only what the ``offsets`` line says, the goal's offsets and the holes beside the
    player (a move's outcomes are its own cell and the two perpendicular ones, never the one
    behind; with one hole beside, the safe move walks away from it). The tie goes toward the
    goal: with no hole beside, the goal straight ahead is as near on average from a step
    across as from a step at it, and the step at it is the one a reader expects. With
    ``scan`` (the four action names in some order) the tie goes instead to the move opposite
    the side that comes first in it: the rule of a thought that lists the sides in that
    order and names the first of the worst kind (``lake="scan"``)."""
    toward = toward_goal("".join(rows).index("G"), cell, len(rows))
    costs = [careful_cost(rows, table, cell, a) for a in range(len(LAKE_ACTIONS))]
    return LAKE_ACTIONS[
        min(range(len(LAKE_ACTIONS)), key=lambda a: (costs[a], _tie_key(a, toward, scan)))
    ]


def _opposite(action: int) -> int:
    """The index in ACTIONS of the move opposite ``action``'s (Left and Right, Down and Up)."""
    return (action + 2) % len(LAKE_ACTIONS)


def _tie_key(action: int, toward: str, scan: Sequence[str] | None) -> tuple[int, int]:
    """`careful_move`'s order among equally careful moves (lowest first): the move ``toward``
    the goal, or with ``scan`` the move opposite the side listed first in it; then ACTIONS
    order."""
    if scan is not None:
        return scan.index(LAKE_ACTIONS[_opposite(action)]), action
    return int(LAKE_ACTIONS[action] != toward), action


def _careful_lake(env: FrozenLakeEnv, limit: int, located: bool) -> ExpertMove:
    """`careful_move`, `limit` times, and the thought that reads it off the offsets: "The goal
    G is 2 below and 1 right of me. A hole O is 1 left of me. Down cannot slip into a hole and
    lands nearest the goal, so I go Down."."""
    rows, state = env.rows, env.state
    if not rows:
        raise ExpertError("the lake has no map yet: reset the env first")
    if rows[state // len(rows)][state % len(rows)] in "GH":
        raise ExpertError("the episode is over: the player is on the goal or in a hole")
    table = transition_table(tuple(rows), env.slippery)
    move = careful_move(rows, table, state)
    fall, _ = careful_cost(rows, table, state, LAKE_ACTIONS.index(move))
    if fall == 0:
        why = f"{move} cannot slip into a hole and lands nearest the goal"
    else:
        why = f"Every move can slip into a hole; {move} risks it least"
    moves = (move,) * limit
    goal = goal_sentence(rows, state, located=located)
    walls = f" {edges_beside(len(rows), state)}" if env.edges else ""
    thought = f"{goal} {holes_beside(rows, state)}{walls} {why}, so I go {' then '.join(moves)}."
    return ExpertMove(thought, moves)


SIDES_EXPERTS = ("sides", "ranked", "scan")
"""The lake experts whose thought names what lies on each side: they reason about slips, so
they play slippery lakes only."""

# The order in which the scan thought (``lake="scan"``) lists the sides, its ties going to the
# first: among the 24 orders, the one whose careful play succeeds most often on the dev lakes
# (`python -m experiments.scan_orders`; the figures in docs/performance.md).
SCAN_ORDER = ("Down", "Up", "Left", "Right")


def _sides_lake(env: FrozenLakeEnv, limit: int, located: bool, lake: str = "sides") -> ExpertMove:
    """`careful_move`, with a thought that derives it: what lies on each side, the worst side,
    and the move away from it: "The goal G is 2 above me. Left away, Down wall, Right away, Up
    toward. Worst is Right; a slip never goes back, so I go Left.".

    On the slippery lake a move lands on its own side or one of the two beside it, never on
    the side behind it, so each move's outcomes are every side but its opposite's: the move
    least likely to fall, then nearest the goal on average, is the one opposite the worst
    side by `frozen_lake.SIDE_KINDS` (a hole, then a step away from the goal, then the edge,
    where the player stays). On a tie the worst side named is the one `careful_move`'s
    tie-break turns its back on.

    ``lake="ranked"`` writes the ranking out before the worst side: the sides of each kind
    from the worst kind down, up to the first kind some side holds, the worst side named
    first ("Hole: none. Away: Right, Left. Worst is Right; ..."), so that naming the worst
    side is copying the first name after the labels instead of ranking four of them.
    ``lake="scan"`` is that thought with the sides in SCAN_ORDER, labels and lists alike, and
    ties going to the side listed first (`careful_move`'s ``scan``): the worst is the first
    side of the worst kind, read left to right."""
    rows, state = env.rows, env.state
    if not rows:
        raise ExpertError("the lake has no map yet: reset the env first")
    if not env.slippery:
        raise ExpertError("the sides expert reasons about slips: play a slippery lake")
    if rows[state // len(rows)][state % len(rows)] in "GH":
        raise ExpertError("the episode is over: the player is on the goal or in a hole")
    scan = SCAN_ORDER if lake == "scan" else None
    move = careful_move(rows, transition_table(tuple(rows), True), state, scan)
    worst = LAKE_ACTIONS[_opposite(LAKE_ACTIONS.index(move))]
    kinds = dict(zip(LAKE_ACTIONS, side_kinds(rows, state), strict=True))
    sides = ", ".join(f"{side} {kinds[side]}" for side in scan or LAKE_ACTIONS)
    if lake == "sides":
        ranking = ""
    else:
        # the sides in the tie-break order of the moves opposite them (with scan, scan's own)
        toward = toward_goal("".join(rows).index("G"), state, len(rows))
        order = sorted(
            LAKE_ACTIONS,
            key=lambda side: _tie_key(_opposite(LAKE_ACTIONS.index(side)), toward, scan),
        )
        ranking = f" {_ranking(kinds, worst, order)}"
    moves = (move,) * limit
    goal = goal_sentence(rows, state, located=located)
    why = f"Worst is {worst}; a slip never goes back, so I go {' then '.join(moves)}."
    return ExpertMove(f"{goal} {sides}.{ranking} {why}", moves)


def _ranking(kinds: dict[str, str], worst: str, order: Sequence[str]) -> str:
    """The sides of each kind (``kinds``: side -> SIDE_KINDS entry) from the worst kind down to
    the first that a side holds: "Hole: none. Away: Right, Left.". ``worst`` comes first, the
    other sides in ``order``. A side toward the goal is never worst (at most two sides are),
    so the list ends by the edge."""
    groups = []
    for kind in reversed(SIDE_KINDS[1:]):
        held = sorted((s for s in order if kinds[s] == kind), key=lambda s: s != worst)
        groups.append(f"{kind.capitalize()}: {', '.join(held) or 'none'}.")
        if held:
            return " ".join(groups)
    raise AssertionError(f"no side of {kinds} is worse than toward the goal")


# ------------------------------------------------------------------ Bandit and Countdown


def _bandit(env: BanditEnv) -> ExpertMove:
    risky = env.high_risk
    safe = next(a for a in env.actions if a != risky)
    pick = risky if env.high_prob * env.high_payoff > env.low_payoff else safe
    other = safe if pick == risky else risky
    kind = "the risky arm" if pick == risky else "the safe arm"
    thought = f"{pick} is {kind}, and its expected reward is higher than {other}'s, so I pull it."
    return ExpertMove(thought, (pick,))


def _countdown(env: CountdownEnv) -> ExpertMove:
    instance = env.instance
    if instance is None:
        raise ExpertError("no Countdown instance yet: reset the env first")
    numbers = ", ".join(map(str, instance.numbers))
    thought = f"I need {instance.target} from {numbers}. {instance.solution} = {instance.target}."
    return ExpertMove(thought, (instance.solution,))
