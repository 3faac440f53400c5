"""FrozenLake (multi-turn, stochastic): cross a slippery lake to the goal, avoiding holes.

The dynamics are gymnasium's FrozenLake, on purpose, so results compare with the RL
literature: on a slippery lake the intended move happens with probability 1/3 and each of
the two perpendicular moves with probability 1/3; a move off the edge stays put; a hole or
the goal ends the episode, and only the goal pays (1). The transition table is built once
per map in gymnasium's layout, `table[state][action] = [(prob, next_state, reward,
terminated), ...]`, and a test checks it entry by entry against gymnasium's own.

Maps use gymnasium's letters internally (S start, F frozen, H hole, G goal) so they can be
handed to gymnasium unchanged. The start is the top-left corner and the goal the
bottom-right one, as gymnasium draws them; with ``random_ends`` both sit on random distinct
cells, as RAGEN's own lakes do (which puts many goals a few steps away: within 10 actions
the best policy reaches them far more often, see experiments/lake_ceiling.py). With
``positions`` a line under the lake gives the row and column of the player, the goal and
each hole, so that a model need not count cells to place them; with ``offsets`` a line says
where the goal and the holes beside the player lie from it, so that it need not subtract
them either.
The agent sees other symbols: P player, _ frozen, O hole, G goal, X player in a hole,
√ player on the goal.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

import numpy as np

from ragen.envs.base import (
    Demonstration,
    EpisodeBudget,
    GenerationError,
    StepResult,
    check_bool,
    check_int,
    check_probability,
    grid_cell,
    info,
    relative_position,
)

ACTIONS = ("Left", "Down", "Right", "Up")  # gymnasium's action indices 0, 1, 2, 3
_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (d_row, d_col) of each action

# Written as gymnasium writes them: the slip probability is "the rest, split in two",
# which in floating point is 0.33333333333333337, not 1/3. Equal tables need equal floats.
SUCCESS_RATE = 1.0 / 3.0
SLIP_RATE = (1.0 - SUCCESS_RATE) / 2.0

# One outcome of an action: (probability, next state, reward, terminated).
_Outcome = tuple[float, int, int, bool]
# table[state][action]: the outcomes of taking `action` on `state`.
_TransitionTable = tuple[tuple[tuple[_Outcome, ...], ...], ...]

MAX_SIZE = 64  # side of the map
MAX_TRIES = 10_000  # map draws before giving up: a 64×64 draw takes well under a millisecond

_TILE = {"S": "_", "F": "_", "H": "O", "G": "G"}  # what the agent sees under no player
_PLAYER = {"S": "P", "F": "P", "H": "X", "G": "√"}  # the player standing on each tile
# How the ice moves the agent, as the instructions tell it: the rule the env plays by.
_SLIPPERY = (
    "The ice is slippery: you move in the direction you choose with probability 1/3, "
    "and slide to each of the two perpendicular directions with probability 1/3. "
)
_NOT_SLIPPERY = "The ice is not slippery: you move in the direction you choose. "

# Salt that gives the slipping a random stream of its own, apart from the map's.
_SLIP_STREAM = 1
# Lakes of the worked turns shown to a small model (rollout.demos). Seeds from 2e9 up are
# never played: training seeds are below 1e9 and evaluation seeds are 1e9 + i. On the 4×4
# corner lakes of these two a hole sits right of the start (so the path starts Down) and
# below it (so it starts Right); on the 8×8 ones the paths also start Down and Right, so the
# examples point to no fixed first action. Lakes with random ends take seeds of their own,
# chosen the same way: first moves Left then Right on 4×4, Right then Down on 8×8, each path
# at least 4 steps long.
_DEMO_SEEDS = (2_000_000_001, 2_000_000_016)
_DEMO_SEEDS_RANDOM_ENDS = (2_000_000_002, 2_000_000_018)


def start_cell(rows: tuple[str, ...] | list[str]) -> int:
    """The start's cell, ``row * size + col``: the player's first state."""
    return "".join(rows).index("S")


def shortest_path(rows: tuple[str, ...] | list[str]) -> list[str] | None:
    """A shortest action list from the start to the goal that steps on no hole.

    Breadth-first over the tiles, as on a lake that does not slip; moves are tried in
    ACTIONS order, so of several shortest paths the one with earlier actions wins.
    None when the holes cut the goal off.
    """
    size = len(rows)
    start = divmod(start_cell(rows), size)
    parents: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque(parents)
    while queue:
        row, col = queue.popleft()
        if rows[row][col] == "G":
            path: list[str] = []
            parent = parents[(row, col)]
            while parent is not None:
                cell, action = parent
                path.append(action)
                parent = parents[cell]
            return path[::-1]
        for action, (d_row, d_col) in zip(ACTIONS, _MOVES, strict=True):
            r, c = row + d_row, col + d_col
            if 0 <= r < size and 0 <= c < size and (r, c) not in parents and rows[r][c] != "H":
                parents[(r, c)] = ((row, col), action)
                queue.append((r, c))
    return None


def is_valid(rows: tuple[str, ...] | list[str]) -> bool:
    """True if the goal can be reached from the start over non-hole tiles."""
    return shortest_path(rows) is not None


def generate_map(
    seed: int, size: int = 4, p: float = 0.8, max_tries: int = 1000, random_ends: bool = False
) -> tuple[str, ...]:
    """A random `size`×`size` map whose goal is reachable; each tile is frozen w.p. `p`.
    The start is top-left and the goal bottom-right, or with `random_ends` two distinct
    cells drawn uniformly after the tiles.

    Raises GenerationError when `max_tries` draws all leave the goal cut off (tiny `p`).
    """
    check_int("seed", seed, 0)
    check_int("size", size, 2, MAX_SIZE)
    p = check_probability("p", p, allow_zero=False)
    check_int("max_tries", max_tries, 1, MAX_TRIES)
    check_bool("random_ends", random_ends)
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        cells = ["F" if f else "H" for f in (rng.random(size * size) < p).tolist()]
        start, goal = (
            rng.choice(size * size, 2, replace=False).tolist()
            if random_ends
            else (0, size * size - 1)
        )
        cells[start], cells[goal] = "S", "G"
        rows = ["".join(cells[r * size : (r + 1) * size]) for r in range(size)]
        if is_valid(rows):
            return tuple(rows)
    raise GenerationError(
        f"no {size}×{size} lake with a path to the goal after max_tries={max_tries} draws "
        f"at p={p}; raise p (the frozen-tile probability)"
    )


@lru_cache(maxsize=512)
def transition_table(rows: tuple[str, ...], slippery: bool = True) -> _TransitionTable:
    """`table[state][action]`: the outcomes `(prob, next_state, reward, terminated)`.

    Cached because a training batch resets a group of copies on the same seed, hence the
    same map. The result is immutable (tuples), so sharing it is safe.
    """
    size = len(rows)
    tiles = "".join(rows)
    # Where each single move lands, computed once per (cell, direction): the slippery
    # table then only picks three of them per action.
    landing = []
    for row in range(size):
        for col in range(size):
            per_direction = []
            for d_row, d_col in _MOVES:
                cell = min(max(row + d_row, 0), size - 1) * size + min(
                    max(col + d_col, 0), size - 1
                )
                per_direction.append((cell, int(tiles[cell] == "G"), tiles[cell] in "GH"))
            landing.append(per_direction)

    table: list[tuple[tuple[_Outcome, ...], ...]] = []
    for state, tile in enumerate(tiles):
        if tile in "GH":
            # An end tile is absorbing, as in gymnasium.
            table.append((((1.0, state, 0, True),),) * 4)
        elif slippery:
            moves = landing[state]
            table.append(
                tuple(
                    (
                        (SLIP_RATE, *moves[(action - 1) % 4]),
                        (SUCCESS_RATE, *moves[action]),
                        (SLIP_RATE, *moves[(action + 1) % 4]),
                    )
                    for action in range(4)
                )
            )
        else:
            table.append(tuple(((1.0, *landing[state][action]),) for action in range(4)))
    return tuple(table)


def draw(
    rows: tuple[str, ...],
    state: int,
    spaced: bool = False,
    positions: bool = False,
    offsets: bool = False,
    coord: bool = False,
    edges: bool = False,
) -> str:
    """The lake as the agent sees it, with the player on cell `state`; `spaced` puts a space
    between cells, `positions` adds the line of `describe_positions`, `offsets` the line of
    `describe_offsets`, `edges` the sentence of `edges_beside` (at the end of the offsets
    line, or on its own), `coord` puts `describe_coordinates` above the lake."""
    size = len(rows)
    cells = [[_TILE[t] for t in line] for line in rows]
    row, col = divmod(state, size)
    cells[row][col] = _PLAYER[rows[row][col]]
    gap = " " if spaced else ""
    lake = "\n".join(gap.join(line) for line in cells)
    lines = [describe_coordinates(rows, state), lake] if coord else [lake]
    if positions:
        lines.append(describe_positions(rows, state))
    if offsets:
        lines.append(describe_offsets(rows, state))
    if edges and offsets:
        lines[-1] = f"{lines[-1]} {edges_beside(len(rows), state, 'you')}"
    elif edges:
        lines.append(edges_beside(len(rows), state, "you"))
    return "\n".join(lines)


# The sentence upstream's coordinate envs mean to add to their instructions (RAGEN-2 never
# appends it, and its text says coordinates reach (5, 5) on a 4×4 lake).
_COORD_HINT = "Coordinates are (row, col), counted from (0, 0) at the top-left.\n"
# What RAGEN-2's coordinate observations call the player, by the tile under it.
_COORD_PLAYER = {"S": "Player", "F": "Player", "H": "Player in hole", "G": "Player on goal"}


def describe_coordinates(rows: tuple[str, ...], state: int) -> str:
    """RAGEN-2's coordinate block (its ``grid_coord`` observations): the board size, then one
    line per kind of thing present, ``Label: (row, col), …`` zero-based from the top-left in
    row-major order (Start, Goal, the player, Holes), then the ``Grid Map: `` header the lake
    follows; the spaces after the two headers are upstream's."""
    size, tiles = len(rows), "".join(rows)

    def at(*cells: int) -> str:
        return ", ".join("({}, {})".format(*divmod(cell, size)) for cell in cells)

    holes = [cell for cell, tile in enumerate(tiles) if tile == "H"]
    lines = [
        "Coordinates: ",
        f"Board size: {size} rows x {size} cols (zero-indexed).",
        f"Start: {at(tiles.index('S'))}",
        f"Goal: {at(tiles.index('G'))}",
        f"{_COORD_PLAYER[tiles[state]]}: {at(state)}",
        *([f"Holes: {at(*holes)}"] if holes else []),
        "Grid Map: ",
    ]
    return "\n".join(lines)


def describe_offsets(rows: tuple[str, ...], state: int) -> str:
    """Where the goal and the holes beside the player lie from it: "The goal G is 3 above
    and 2 left of you. A hole O is 1 above you." Nothing is said of the goal the player
    stands on."""
    if "".join(rows).index("G") == state:
        return holes_beside(rows, state, "you")
    return f"{goal_sentence(rows, state, 'you')} {holes_beside(rows, state, 'you')}"


def goal_sentence(
    rows: tuple[str, ...], cell: int, anchor: str = "me", located: bool = False
) -> str:
    """Where the goal lies from the player on ``cell`` (not the goal's): "The goal G is 3 above
    and 2 left of me." (``anchor`` names the player); ``located`` first gives both cells, as
    `describe_positions` shows them: "I am at row 4, column 4. The goal G is at row 1, column
    2, 3 above and 2 left of me."."""
    size = len(rows)
    goal = "".join(rows).index("G")
    (row, col), (goal_row, goal_col) = divmod(cell, size), divmod(goal, size)
    where = relative_position(goal_row - row, goal_col - col, anchor)
    if not located:
        return f"The goal {_TILE['G']} is {where}."
    return (
        f"I am at {grid_cell(cell, size)}. "
        f"The goal {_TILE['G']} is at {grid_cell(goal, size)}, {where}."
    )


def toward_goal(goal: int, cell: int, size: int) -> str:
    """The action from ``cell`` toward ``goal`` (cells of a lake ``size`` wide) along the
    larger offset, vertical on a tie, whatever the holes: the simplest policy that reads the
    lake (`experiments/lake_ceiling.py` scores it)."""
    (row, col), (goal_row, goal_col) = divmod(cell, size), divmod(goal, size)
    if abs(goal_row - row) >= abs(goal_col - col):
        return "Down" if goal_row > row else "Up"
    return "Right" if goal_col > col else "Left"


def describe_positions(rows: tuple[str, ...], state: int) -> str:
    """Where the player, the goal and the holes are, counted from row 1, column 1 at the
    top-left: "You are at row 4, column 4. The goal G is at row 1, column 2. Holes O are at:
    row 2, column 3; row 3, column 1." (holes in reading order)."""
    size, flat = len(rows), "".join(rows)
    holes = [grid_cell(cell, size) for cell, tile in enumerate(flat) if tile == "H"]
    if not holes:
        where_holes = "There is no hole."
    elif len(holes) == 1:
        where_holes = f"A hole {_TILE['H']} is at {holes[0]}."
    else:
        where_holes = f"Holes {_TILE['H']} are at: {'; '.join(holes)}."
    return (
        f"You are at {grid_cell(state, size)}. The goal {_TILE['G']} is at "
        f"{grid_cell(flat.index('G'), size)}. {where_holes}"
    )


class FrozenLakeEnv:
    """Walk from the start to the goal on a random slippery lake.

    Options: size (side of the map), p (frozen-tile probability), slippery, max_actions,
    spaced (a space between cells: SmolLM2's tokenizer merges runs such as `___` into one
    token, so only the spaced lake gives every cell its own token), random_ends (start and
    goal on random distinct cells, as RAGEN's lakes, instead of the top-left and
    bottom-right corners), positions (a line under the lake with the row and column of the
    player, the goal and the holes), offsets (a line with the goal's place from the player
    and the holes beside it), edges (which edges of the lake the player stands against: a
    slip into one leaves the player in place, which the careful rule weighs), coord
    (RAGEN-2's coordinate block above the lake, as its CoordFrozenLake shows it:
    `describe_coordinates`).
    """

    actions: tuple[str, ...] = ACTIONS

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        slippery: bool = True,
        max_actions: int = 100,
        max_tries: int = 1000,
        spaced: bool = False,
        random_ends: bool = False,
        positions: bool = False,
        offsets: bool = False,
        coord: bool = False,
        edges: bool = False,
    ) -> None:
        self.size = check_int("size", size, 2, MAX_SIZE)
        self.p = check_probability("p", p, allow_zero=False)
        self.slippery = check_bool("slippery", slippery)
        self.spaced = check_bool("spaced", spaced)
        self.random_ends = check_bool("random_ends", random_ends)
        self.positions = check_bool("positions", positions)
        self.offsets = check_bool("offsets", offsets)
        self.coord = check_bool("coord", coord)
        self.edges = check_bool("edges", edges)
        self.max_tries = check_int("max_tries", max_tries, 1, MAX_TRIES)
        self._budget = EpisodeBudget(max_actions)
        self._index = {word.casefold(): i for i, word in enumerate(ACTIONS)}
        self.rows: tuple[str, ...] = ()
        self._table: _TransitionTable = ()
        self._state = 0
        self._views: list[str | None] = []
        self._rng = np.random.default_rng(0)
        self._uniforms: list[float] = []

    def instructions(self) -> str:
        return (
            "You are walking on a frozen lake. Reach the goal without falling into a hole. "
            + (_SLIPPERY if self.slippery else _NOT_SLIPPERY)
            + "Walking into the edge leaves you where you are.\n"
            "Symbols: P you, _ frozen ice, O hole, G goal, X you in a hole, √ you on the goal.\n"
            + (_COORD_HINT if self.coord else "")
            + "Reward: 1 for reaching the goal, 0 otherwise.\n"
            f"Actions: {', '.join(ACTIONS)}."
        )

    def reset(self, seed: int) -> str:
        rows = generate_map(seed, self.size, self.p, self.max_tries, self.random_ends)
        return self.load(rows, seed)

    demo_count = len(_DEMO_SEEDS)

    def demonstrations(self) -> tuple[Demonstration, ...]:
        """Worked first turns of two lakes this env never deals (see `Demonstration`).

        Each answer is a whole shortest hole-free path (`shortest_path`); the thought says
        where the goal is and whether a hole lies beside the start.
        """
        worked = []
        for seed in _DEMO_SEEDS_RANDOM_ENDS if self.random_ends else _DEMO_SEEDS:
            other = FrozenLakeEnv(
                self.size,
                self.p,
                self.slippery,
                max_tries=self.max_tries,
                spaced=self.spaced,
                random_ends=self.random_ends,
                positions=self.positions,
                offsets=self.offsets,
                coord=self.coord,
                edges=self.edges,
            )
            observation = other.reset(seed)
            path = shortest_path(other.rows)
            assert path is not None  # generate_map deals only lakes with a path to the goal
            thought = _demo_thought(other.rows, path[0], located=self.positions)
            worked.append(Demonstration(other.instructions(), observation, thought, tuple(path)))
        return tuple(worked)

    def load(self, rows: tuple[str, ...] | list[str], seed: int) -> str:
        """Start an episode on a given map (S, F, H, G rows); `seed` drives the slipping."""
        rows = tuple(rows)
        size = len(rows)
        if any(len(row) != size or set(row) - set("SFHG") for row in rows) or [
            "".join(rows).count(end) for end in "SG"
        ] != [1, 1]:
            raise ValueError("a lake map is square rows of S, F, H, G with one S and one G")
        self.rows = rows
        self._table = transition_table(self.rows, self.slippery)
        self._state = start_cell(rows)
        self._views = [None] * (size * size)
        self._rng = np.random.default_rng([seed, _SLIP_STREAM])
        self._uniforms = []
        self._budget.start()
        return self.render()

    def _uniform(self) -> float:
        # Drawn in blocks: one numpy call per 64 steps instead of one per step.
        if not self._uniforms:
            self._uniforms = self._rng.random(64).tolist()[::-1]
        return self._uniforms.pop()

    def step(self, action: str) -> StepResult:
        self._budget.spend()
        index = self._index.get(action.strip().casefold())
        if index is None:
            truncated = self._budget.close(terminated=False)
            return StepResult(self.render(), 0.0, False, truncated, info(False, False, False))
        u = self._uniform()
        # Inverse-CDF sampling over the (at most three) outcomes; float round-off that
        # leaves u >= 0 after the loop falls through to the last outcome, as it should.
        outcomes = self._table[self._state][index]
        chosen = outcomes[-1]
        for outcome in outcomes:
            u -= outcome[0]
            if u < 0:
                chosen = outcome
                break
        _, state, reward, terminated = chosen
        moved = state != self._state
        self._state = state
        truncated = self._budget.close(terminated)
        observation = self.render()
        return StepResult(
            observation, float(reward), terminated, truncated, info(reward > 0, True, moved)
        )

    def render(self) -> str:
        if not self.rows:
            return ""
        view = self._views[self._state]
        if view is None:
            view = self._views[self._state] = draw(
                self.rows,
                self._state,
                self.spaced,
                self.positions,
                self.offsets,
                self.coord,
                self.edges,
            )
        return view

    @property
    def state(self) -> int:
        """The player's cell, `row * size + col` (gymnasium's observation)."""
        return self._state


def neighbours(size: int, cell: int) -> tuple[int | None, ...]:
    """The cell one step from ``cell`` in each direction, in ACTIONS order; None past the
    lake's edge."""
    row, col = divmod(cell, size)
    return tuple(
        (row + d_row) * size + col + d_col
        if 0 <= row + d_row < size and 0 <= col + d_col < size
        else None
        for d_row, d_col in _MOVES
    )


def holes_beside(rows: tuple[str, ...], cell: int, anchor: str = "me") -> str:
    """A sentence on the holes next to ``cell`` (in ACTIONS order): "No hole is beside me.",
    "A hole O is 1 below me." or "Holes O are 1 left of me and 1 below me." (``anchor``
    names the player)."""
    tiles = "".join(rows)
    holes = [
        relative_position(d_row, d_col, anchor)
        for (d_row, d_col), near in zip(_MOVES, neighbours(len(rows), cell), strict=True)
        if near is not None and tiles[near] == "H"
    ]
    if not holes:
        return f"No hole is beside {anchor}."
    if len(holes) == 1:
        return f"A hole {_TILE['H']} is {holes[0]}."
    return f"Holes {_TILE['H']} are {', '.join(holes[:-1])} and {holes[-1]}."


# What the edge beside the player is called, in ACTIONS order.
_EDGE_SIDES = ("left of", "below", "right of", "above")


def edges_beside(size: int, cell: int, anchor: str = "me") -> str:
    """A sentence on the lake's edges next to ``cell`` (in ACTIONS order): "No edge is beside
    me.", "The edge is above me." or "Edges are left of me and above me." (``anchor`` names
    the player)."""
    sides = [
        f"{side} {anchor}"
        for side, near in zip(_EDGE_SIDES, neighbours(size, cell), strict=True)
        if near is None
    ]
    if not sides:
        return f"No edge is beside {anchor}."
    if len(sides) == 1:
        return f"The edge is {sides[0]}."
    return f"Edges are {' and '.join(sides)}."


# What one step to a side of the player does, from best to worst for the player: nearer the
# goal, into the lake's edge (the player stays), farther from the goal, into a hole.
SIDE_KINDS = ("toward", "wall", "away", "hole")


def steps_to_goal(size: int, goal: int, cell: int) -> int:
    """Steps along rows and columns from ``cell`` to ``goal`` on a lake ``size`` wide, holes
    ignored."""
    (row, col), (goal_row, goal_col) = divmod(cell, size), divmod(goal, size)
    return abs(goal_row - row) + abs(goal_col - col)


def side_kinds(rows: tuple[str, ...], cell: int) -> tuple[str, ...]:
    """What lies one step from ``cell`` on each side, in ACTIONS order, each one of
    SIDE_KINDS: a hole, the edge, or a frozen tile (or the goal) nearer to or farther from
    the goal, counted along rows and columns."""
    size, tiles = len(rows), "".join(rows)
    goal = tiles.index("G")
    here = steps_to_goal(size, goal, cell)

    def kind(near: int | None) -> str:
        if near is None:
            return "wall"
        if tiles[near] == "H":
            return "hole"
        return "toward" if steps_to_goal(size, goal, near) < here else "away"

    return tuple(kind(near) for near in neighbours(size, cell))


def _demo_thought(rows: tuple[str, ...], first: str, located: bool = False) -> str:
    """A short true note on a lake's start: where the goal is, the holes beside the player;
    `located` first gives the player's and the goal's row and column (as `positions` shows
    them)."""
    start = start_cell(rows)
    beside = holes_beside(rows, start).removesuffix(".")
    return f"{goal_sentence(rows, start, located=located)} {beside}, so I go {first}."
