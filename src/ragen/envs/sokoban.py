"""Sokoban (multi-turn, deterministic, irreversible): push every box onto a target.

Rooms are made in three pure steps from one `numpy.random.default_rng(seed)`:

1. carve: a random walk through a walled rectangle turns wall into floor;
2. place: targets and the player go on random floor cells, each box starts on its target;
3. reverse play: the player walks at random and *pulls* any box behind it. A pull is a push
   run backwards, so replaying the walk in reverse solves the room: every room is
   solvable by construction. Along the walk we keep the state whose boxes are all off the
   targets and farthest (Manhattan) from them.

`solve(room)` is a breadth-first search over (player, boxes) that returns a shortest action
list; the tests run it on every generated room and replay the answer to success.

Cells are indexed row-major (`row * width + col`). The border is always wall, so a move
from any floor cell stays on the grid and needs no bounds check.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TypedDict

import numpy as np

from ragen.envs.base import (
    Demonstration,
    EpisodeBudget,
    GenerationError,
    StepResult,
    action_lookup,
    check_bool,
    check_int,
    info,
    match_action,
    relative_position,
)

ACTIONS = ("Up", "Down", "Left", "Right")

STEP_PENALTY = -0.1  # every action, effective or not: shorter solutions score higher
BOX_ON_TARGET = 1.0  # a box pushed onto a target (and minus this for one pushed off)
SOLVED_BONUS = 10.0

SYMBOL_ROLES = ("wall", "floor", "target", "box", "box_on_target", "player", "player_on_target")
DEFAULT_SYMBOLS = MappingProxyType(
    {
        "wall": "#",
        "floor": "_",
        "target": "O",
        "box": "X",
        "box_on_target": "√",
        "player": "P",
        "player_on_target": "S",
    }
)
# Same rooms, other glyphs: tests whether a policy learned the game or the characters.
NEW_VOCAB = MappingProxyType(
    {
        "wall": "W",
        "floor": ".",
        "target": "T",
        "box": "B",
        "box_on_target": "D",
        "player": "A",
        "player_on_target": "E",
    }
)
LEGEND = {
    "wall": "wall",
    "floor": "empty floor",
    "target": "target",
    "box": "box",
    "box_on_target": "box on a target",
    "player": "you",
    "player_on_target": "you, standing on a target",
}

MIN_SIDE, MAX_SIDE = 5, 32
# Bounds of the generator's effort: one try at the longest walks takes about 20 ms and
# draws its floats up front (under 1 MB), so even a room that cannot be made is given up
# within seconds; the defaults of a 32×32 room (carve 108, pull 7200 steps) are far below.
MAX_WALK_STEPS = 20_000
MAX_TRIES = 1000
TURN_PROB = 0.35  # chance per carving step that the digger changes direction
# Shapes the digger clears around its cell: mostly single cells and pairs, so rooms get
# corridors and a few open spots rather than one empty hall.
_BRUSHES = (
    ((0, 0),),
    ((0, 0),),
    ((0, 0), (0, 1)),
    ((0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0), (1, 1)),
)
# Rooms of the worked turns shown to a small model (rollout.demos). Seeds from 2e9 up are
# never played: training seeds are below 1e9 and evaluation seeds are 1e9 + i. These two
# start with different moves in the 6×6 one-box room (Up, Right, Down: push the box down;
# Left, Left: push it left) and in the 8×8 two-box room (Down..., Left...), so the
# examples point to no fixed first action.
_DEMO_SEEDS = (2_000_000_000, 2_000_000_001)
# The sentence upstream's coordinate envs mean to add to their instructions (RAGEN-2 never
# appends it).
_COORD_HINT = "Coordinates are (row, col), counted from (0, 0) at the top-left.\n"


@dataclass(frozen=True)
class Room:
    """A Sokoban state: the static map (floor, targets) plus boxes and player.

    floor: one byte per cell, 1 for floor, 0 for wall; targets, boxes: cell indices.
    """

    height: int
    width: int
    floor: bytes
    targets: frozenset[int]
    boxes: frozenset[int]
    player: int

    @property
    def solved(self) -> bool:
        return self.boxes <= self.targets

    def offsets(self) -> dict[str, int]:
        """Index offset of one move in each action direction."""
        return {"Up": -self.width, "Down": self.width, "Left": -1, "Right": 1}

    def render(self, symbols: Mapping[str, str] = DEFAULT_SYMBOLS, spaced: bool = False) -> str:
        return _draw(self, self.boxes, self.player, symbols, spaced)

    @classmethod
    def from_text(cls, text: str, symbols: Mapping[str, str] = DEFAULT_SYMBOLS) -> Room:
        """Parse a drawn room (one line per row, spaced or not); the outer ring must be wall."""
        role_of = {glyph: role for role, glyph in symbols.items()}
        rows = [line.replace(" ", "") for line in text.strip().splitlines()]
        height, width = len(rows), len(rows[0])
        if any(len(row) != width for row in rows):
            raise ValueError("every row of a room must have the same length")
        floor, targets, boxes, players = bytearray(height * width), set(), set(), []
        for index, glyph in enumerate("".join(rows)):
            role = role_of.get(glyph)
            if role is None:
                raise ValueError(f"unknown room symbol {glyph!r}; known: {''.join(role_of)}")
            floor[index] = role != "wall"
            if role in ("target", "box_on_target", "player_on_target"):
                targets.add(index)
            if role in ("box", "box_on_target"):
                boxes.add(index)
            if role in ("player", "player_on_target"):
                players.append(index)
        border = [i for i in range(height * width) if _on_border(i, height, width)]
        if len(players) != 1 or any(floor[i] for i in border) or len(boxes) != len(targets):
            raise ValueError("a room needs one player, a wall border, and as many boxes as targets")
        return cls(height, width, bytes(floor), frozenset(targets), frozenset(boxes), players[0])


def _on_border(index: int, height: int, width: int) -> bool:
    row, col = divmod(index, width)
    return row in (0, height - 1) or col in (0, width - 1)


def _draw(
    room: Room,
    boxes: Iterable[int],
    player: int,
    symbols: Mapping[str, str],
    spaced: bool = False,
) -> str:
    """The grid as text, one row per line; `spaced` puts a space between cells."""
    cells = [
        symbols["target"] if i in room.targets else symbols["floor" if f else "wall"]
        for i, f in enumerate(room.floor)
    ]
    for box in boxes:
        cells[box] = symbols["box_on_target" if box in room.targets else "box"]
    cells[player] = symbols["player_on_target" if player in room.targets else "player"]
    w = room.width
    gap = " " if spaced else ""
    return "\n".join(gap.join(cells[r * w : (r + 1) * w]) for r in range(room.height))


def describe_coordinates(room: Room, boxes: Iterable[int], player: int) -> str:
    """RAGEN-2's coordinate block (its ``grid_coord`` observations): the board size, then one
    line per kind of thing present, ``Label: (row, col), …`` zero-based from the top-left in
    row-major order (Targets, covered ones too; Boxes; Boxes on target; the player; walls
    are not listed), then the ``Grid Map: `` header the grid follows; the spaces after the
    two headers are upstream's."""
    w = room.width

    def at(cells: Iterable[int]) -> str:
        return ", ".join("({}, {})".format(*divmod(cell, w)) for cell in sorted(cells))

    boxes = set(boxes)
    kinds = (
        ("Targets", room.targets),
        ("Boxes", boxes - room.targets),
        ("Boxes on target", boxes & room.targets),
        ("Player on target" if player in room.targets else "Player", {player}),
    )
    return "\n".join(
        [
            "Coordinates: ",
            f"Board size: {room.height} rows x {w} cols (zero-indexed).",
            *(f"{label}: {at(cells)}" for label, cells in kinds if cells),
            "Grid Map: ",
        ]
    )


def check_symbols(symbols: Mapping[str, str]) -> Mapping[str, str]:
    """`symbols` if it maps every role to its own single character, else a ValueError."""
    missing = [role for role in SYMBOL_ROLES if role not in symbols]
    glyphs = [symbols.get(role) for role in SYMBOL_ROLES]
    if (
        missing
        or set(symbols) - set(SYMBOL_ROLES)
        or not all(isinstance(g, str) and len(g) == 1 and not g.isspace() for g in glyphs)
        or len(set(glyphs)) != len(glyphs)
    ):
        raise ValueError(
            f"symbols must map each of {', '.join(SYMBOL_ROLES)} to its own single "
            f"non-space character; got {dict(symbols)!r}"
        )
    return MappingProxyType(dict(symbols))


def max_boxes(height: int, width: int) -> int:
    """The most boxes a room of this size accepts: each box needs a target and a free cell."""
    return ((height - 2) * (width - 2) - 1) // 2


def check_room_options(height: int, width: int, num_boxes: int) -> None:
    """ValueErrors that name the option and what is allowed."""
    check_int("height", height, MIN_SIDE, MAX_SIDE)
    check_int("width", width, MIN_SIDE, MAX_SIDE)
    check_int(f"num_boxes (for a {height}×{width} room)", num_boxes, 1, max_boxes(height, width))


def check_generator_options(
    carve_steps: int | None, pull_steps: int | None, max_tries: int
) -> None:
    """ValueErrors that name the option and what is allowed."""
    if carve_steps is not None:
        check_int("carve_steps", carve_steps, 1, MAX_WALK_STEPS)
    if pull_steps is not None:
        check_int("pull_steps", pull_steps, 1, MAX_WALK_STEPS)
    check_int("max_tries", max_tries, 1, MAX_TRIES)


# --------------------------------------------------------------------------- generator


@lru_cache(maxsize=64)
def _interior(height: int, width: int) -> bytes:
    """1 for every cell inside the wall border."""
    return bytes(
        0 < i // width < height - 1 and 0 < i % width < width - 1 for i in range(height * width)
    )


def _carve(u: Iterator[float], height: int, width: int, steps: int) -> bytearray:
    """Floor made by a random walk that stays inside the wall border.

    `u` yields uniform floats; drawing them in one numpy call per attempt (instead of one
    call per decision) is most of what makes generation fast.
    """
    inside = _interior(height, width)
    floor = bytearray(height * width)
    moves = (-width, width, -1, 1)
    brushes = tuple(tuple(r * width + c for r, c in brush) for brush in _BRUSHES)
    row = 1 + int(next(u) * (height - 2))
    col = 1 + int(next(u) * (width - 2))
    position, move = row * width + col, moves[int(next(u) * 4)]
    for _ in range(steps):
        if next(u) < TURN_PROB:
            move = moves[int(next(u) * 4)]
        if inside[position + move]:
            position += move
        for offset in brushes[int(next(u) * len(brushes))]:
            if inside[position + offset]:
                floor[position + offset] = 1
    return floor


def _displacement(boxes: list[int], targets: list[int], width: int) -> int:
    """Sum of Manhattan distances of each box from the target it started on."""
    total = 0
    for box, target in zip(boxes, targets, strict=True):
        b_row, b_col = divmod(box, width)
        t_row, t_col = divmod(target, width)
        total += abs(b_row - t_row) + abs(b_col - t_col)
    return total


def _pick_distinct(u: Iterator[float], cells: list[int], count: int) -> list[int]:
    """`count` different cells at random (a partial Fisher-Yates shuffle)."""
    cells = cells.copy()
    for k in range(count):
        j = k + int(next(u) * (len(cells) - k))
        cells[k], cells[j] = cells[j], cells[k]
    return cells[:count]


def _reverse_play(
    u: Iterator[float], floor: bytearray, width: int, num_boxes: int, steps: int
) -> tuple[list[int], list[int], int] | None:
    """Targets, boxes and player of the hardest-looking state of one random pulling walk.

    Returns None when no state of the walk has every box off the targets.
    """
    cells = [i for i, f in enumerate(floor) if f]
    *targets, player = _pick_distinct(u, cells, num_boxes + 1)
    target_set = set(targets)
    boxes = list(targets)  # box k starts on target k: the solved state
    moves = (-width, width, -1, 1)
    best_score, best_boxes, best_player = 0, None, player
    at_best = False
    for _ in range(steps):
        move = moves[int(next(u) * 4)]
        ahead = player + move
        if not floor[ahead] or ahead in boxes:
            continue
        behind = player - move
        if behind in boxes:
            # Pull: the box behind follows the player into the cell it leaves.
            boxes[boxes.index(behind)] = player
            player = ahead
            at_best = False
            if target_set.isdisjoint(boxes):
                score = _displacement(boxes, targets, width)
                if score > best_score:
                    best_score, best_boxes, best_player, at_best = score, boxes.copy(), player, True
        else:
            player = ahead
            if at_best:
                # Same boxes, the player wandered on: start it there, away from the box.
                best_player = player
    if best_boxes is None:
        return None
    return targets, best_boxes, best_player


def generate_room(
    seed: int,
    height: int = 6,
    width: int = 6,
    num_boxes: int = 1,
    *,
    carve_steps: int | None = None,
    pull_steps: int | None = None,
    max_tries: int = 100,
) -> Room:
    """A solvable room, the same for the same arguments on every machine.

    carve_steps: length of the digging walk (default 1.7 × (height + width), gym-sokoban's
        choice; larger rooms need longer walks).
    pull_steps: length of the reverse-play walk (default 8 × the interior area; longer
        walks give harder rooms, see benchmarks/envs.py).
    Raises GenerationError after `max_tries` failed attempts.
    """
    check_int("seed", seed, 0)
    check_room_options(height, width, num_boxes)
    check_generator_options(carve_steps, pull_steps, max_tries)
    if carve_steps is None:
        carve_steps = int(1.7 * (height + width))
    if pull_steps is None:
        pull_steps = 8 * (height - 2) * (width - 2)
    rng = np.random.default_rng(seed)
    # Upper bound on the floats one attempt uses: 3 + 2 per carving step + 1 per brush,
    # one per picked cell, one per pulling step.
    draws = 3 + 3 * carve_steps + num_boxes + 1 + pull_steps
    for _ in range(max_tries):
        u = iter(rng.random(draws).tolist())
        floor = _carve(u, height, width, carve_steps)
        if floor.count(1) < 2 * num_boxes + 1:
            continue
        found = _reverse_play(u, floor, width, num_boxes, pull_steps)
        if found is not None:
            targets, boxes, player = found
            return Room(height, width, bytes(floor), frozenset(targets), frozenset(boxes), player)
    raise GenerationError(
        f"no {height}×{width} room with {num_boxes} box(es) after max_tries={max_tries} "
        "attempts; use fewer boxes, a larger room, or more carve_steps"
    )


# --------------------------------------------------------------------------- solver


def _dead_cells(room: Room) -> frozenset[int]:
    """Floor corners that are not targets: a box pushed there can never move again."""
    w, floor = room.width, room.floor
    dead = set()
    for i, f in enumerate(floor):
        if not f or i in room.targets:
            continue
        blocked_vertical = not floor[i - w] or not floor[i + w]
        blocked_horizontal = not floor[i - 1] or not floor[i + 1]
        if blocked_vertical and blocked_horizontal:
            dead.add(i)
    return frozenset(dead)


def _path(parents: dict, state: tuple) -> list[str]:
    moves = []
    while parents[state] is not None:
        state, move = parents[state]
        moves.append(move)
    return moves[::-1]


def solve(room: Room, max_states: int = 2_000_000) -> list[str] | None:
    """A shortest action list that solves `room`, or None if it cannot be solved.

    Breadth-first over (player, sorted boxes), so the first solution found is shortest in
    actions. Pushing a box into a non-target corner is pruned (it can never be solved
    from there), which keeps the search small without losing optimality.
    Raises RuntimeError if more than `max_states` states were needed.
    """
    if room.solved:
        return []
    floor, targets, dead = room.floor, room.targets, _dead_cells(room)
    moves = tuple(room.offsets().items())
    start = (room.player, tuple(sorted(room.boxes)))
    parents: dict[tuple, tuple | None] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for state in frontier:
            player, boxes = state
            for name, step in moves:
                ahead = player + step
                if not floor[ahead]:
                    continue
                pushed = ahead in boxes
                if pushed:
                    beyond = ahead + step
                    if not floor[beyond] or beyond in boxes or beyond in dead:
                        continue
                    boxes_after = tuple(sorted(beyond if b == ahead else b for b in boxes))
                else:
                    boxes_after = boxes
                child = (ahead, boxes_after)
                if child in parents:
                    continue
                parents[child] = (state, name)
                if pushed and targets.issuperset(boxes_after):
                    return _path(parents, child)
                following.append(child)
        if len(parents) > max_states:
            raise RuntimeError(f"solve gave up after {max_states} states")
        frontier = following
    return None


# --------------------------------------------------------------------------- environment


class _GeneratorOptions(TypedDict):
    """The options of `generate_room` that a SokobanEnv passes on."""

    height: int
    width: int
    num_boxes: int
    carve_steps: int | None
    pull_steps: int | None
    max_tries: int


class SokobanEnv:
    """Push all boxes onto targets; actions Up, Down, Left, Right (a move into a box pushes it).

    Rewards: -0.1 per action, +1 for a box pushed onto a target, -1 for one pushed off,
    +10 when every box is on a target (which ends the episode). `load(room)` starts an
    episode from a given room instead of a generated one.

    `spaced=True` draws a space between cells. Byte-pair tokenizers merge runs of wall and
    floor (SmolLM2's makes `####` and `____` one token each), so in the unspaced grid a
    cell's column is not its token position; spaced, every cell is one token. `coord=True`
    puts RAGEN-2's coordinate block above the grid, as its CoordSokoban shows it
    (`describe_coordinates`).
    """

    actions: tuple[str, ...] = ACTIONS

    def __init__(
        self,
        height: int = 6,
        width: int = 6,
        num_boxes: int = 1,
        max_actions: int = 100,
        symbols: Mapping[str, str] = DEFAULT_SYMBOLS,
        carve_steps: int | None = None,
        pull_steps: int | None = None,
        max_tries: int = 100,
        spaced: bool = False,
        coord: bool = False,
    ) -> None:
        check_room_options(height, width, num_boxes)
        check_generator_options(carve_steps, pull_steps, max_tries)
        self.symbols = check_symbols(symbols)
        self.spaced = check_bool("spaced", spaced)
        self.coord = check_bool("coord", coord)
        self._generator_options: _GeneratorOptions = {
            "height": height,
            "width": width,
            "num_boxes": num_boxes,
            "carve_steps": carve_steps,
            "pull_steps": pull_steps,
            "max_tries": max_tries,
        }
        self._lookup = action_lookup(ACTIONS)
        self._budget = EpisodeBudget(max_actions)
        self._room: Room | None = None
        self._boxes: set[int] = set()
        self._player = 0
        self._offsets: dict[str, int] = {}
        self._text = ""

    def instructions(self) -> str:
        s = self.symbols
        legend = ", ".join(f"{s[role]} {LEGEND[role]}" for role in SYMBOL_ROLES)
        return (
            "You are solving a Sokoban puzzle. Push every box onto a target. You can push a "
            "box by walking into it, but you cannot pull it, and you cannot push two boxes at "
            "once or push a box into a wall.\n"
            f"Symbols: {legend}.\n"
            + (_COORD_HINT if self.coord else "")
            + "Rewards: -0.1 per action, +1 for a box pushed onto a target, -1 for a box pushed "
            "off a target, +10 when all boxes are on targets.\n"
            f"Actions: {', '.join(ACTIONS)}."
        )

    def reset(self, seed: int) -> str:
        return self.load(generate_room(seed, **self._generator_options))

    demo_count = len(_DEMO_SEEDS)

    def demonstrations(self) -> tuple[Demonstration, ...]:
        """Worked first turns of two rooms this env never deals (see `Demonstration`).

        Each answer is the room's whole shortest solution (`solve`); the thought says
        where the first box to be pushed and a target lie, and which way it is pushed.
        """
        worked = []
        for seed in _DEMO_SEEDS:
            other = SokobanEnv(
                **self._generator_options,
                symbols=self.symbols,
                spaced=self.spaced,
                coord=self.coord,
            )
            observation = other.reset(seed)
            try:
                solution = solve(other.room)
            except RuntimeError as err:  # the solver's state bound
                raise GenerationError(
                    f"no worked turn for this room size and box count ({err}): use fewer "
                    "boxes or a smaller room, or no demonstrations"
                ) from None
            assert solution is not None  # generate_room deals only solvable rooms
            thought = _demo_thought(other.room, solution, self.symbols)
            worked.append(
                Demonstration(other.instructions(), observation, thought, tuple(solution))
            )
        return tuple(worked)

    def load(self, room: Room) -> str:
        """Start an episode from `room`; returns the first observation."""
        self._room = room
        self._boxes = set(room.boxes)
        self._player = room.player
        self._offsets = room.offsets()
        self._budget.start()
        self._text = self._view()
        return self._text

    def step(self, action: str) -> StepResult:
        self._budget.spend()
        move = match_action(self._lookup, action)
        if move is None:
            truncated = self._budget.close(terminated=False)
            return StepResult(self._text, 0.0, False, truncated, info(False, False, False))
        reward, moved = STEP_PENALTY, self._move(self._offsets[move])
        if moved is not None:
            reward += moved
        room = self._room
        assert room is not None  # spend() above raised unless load() set the room
        solved = self._boxes <= room.targets
        if solved:
            reward += SOLVED_BONUS
        truncated = self._budget.close(terminated=solved)
        self._text = self._view()
        return StepResult(
            self._text, reward, solved, truncated, info(solved, True, moved is not None)
        )

    def _move(self, step: int) -> float | None:
        """Move the player (pushing a box if one is ahead); the target reward, None if blocked."""
        room = self._room
        assert room is not None  # only step() moves, after load() set the room
        floor, targets, boxes = room.floor, room.targets, self._boxes
        ahead = self._player + step
        if not floor[ahead]:
            return None
        if ahead not in boxes:
            self._player = ahead
            return 0.0
        beyond = ahead + step
        if not floor[beyond] or beyond in boxes:
            return None
        boxes.remove(ahead)
        boxes.add(beyond)
        self._player = ahead
        return BOX_ON_TARGET * ((beyond in targets) - (ahead in targets))

    def _view(self) -> str:
        """What the agent sees of the current state: the grid, under the coordinate block
        with ``coord``."""
        room = self._room
        assert room is not None  # load() sets the room before any view
        grid = _draw(room, self._boxes, self._player, self.symbols, self.spaced)
        if not self.coord:
            return grid
        return f"{describe_coordinates(room, self._boxes, self._player)}\n{grid}"

    def render(self) -> str:
        return self._text

    @property
    def room(self) -> Room:
        """The current state as a `Room` (for `solve` and for saving a level)."""
        if self._room is None:
            raise RuntimeError("no room yet: call reset(seed) or load(room)")
        return Room(
            self._room.height,
            self._room.width,
            self._room.floor,
            self._room.targets,
            frozenset(self._boxes),
            self._player,
        )


def _demo_thought(room: Room, solution: list[str], symbols: Mapping[str, str]) -> str:
    """A short true note on `room`: the first box `solution` pushes, a target, the push."""
    offsets, player = room.offsets(), room.player
    for move in solution:
        ahead = player + offsets[move]
        if ahead in room.boxes:  # the first push: no box has moved yet
            break
        player = ahead
    box = ahead
    target = min(room.targets, key=lambda t: (cell_distance(box, t, room.width), t))
    article = "The" if len(room.boxes) == 1 else "A"
    return (
        f"{article} box {symbols['box']} is {relative_cell(room.player, box, room.width, 'me')}. "
        f"{article} target {symbols['target']} is {relative_cell(box, target, room.width, 'it')}. "
        f"I push the box {move}."
    )


def relative_cell(origin: int, cell: int, width: int, anchor: str) -> str:
    """Where ``cell`` lies from ``origin`` in a room ``width`` wide, in words ("1 below me")."""
    (row, col), (o_row, o_col) = divmod(cell, width), divmod(origin, width)
    return relative_position(row - o_row, col - o_col, anchor)


def cell_distance(a: int, b: int, width: int) -> int:
    """Moves between two cells of a room ``width`` wide, walls ignored (Manhattan distance)."""
    (a_row, a_col), (b_row, b_col) = divmod(a, width), divmod(b, width)
    return abs(a_row - b_row) + abs(a_col - b_col)
