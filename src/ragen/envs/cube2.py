"""The 2×2 Rubik's cube, or pocket cube (multi-turn, deterministic): turn faces until every
face shows one colour.

A cube is a string of 24 colour letters, four stickers a face, the faces in the order Up,
Left, Front, Right, Back, Down, each read top-left, top-right, bottom-left, bottom-right as
one sees it looking straight at it: the four side faces with Up above them, Up with Back
above it, Down with Front above it (the usual unfolded net). The solved cube in the
standard colours is `SOLVED`: white Up, orange Left, green Front, red Right, blue Back,
yellow Down.

The actions are Singmaster's quarter turns: U, D, L, R, F, B turn the Up, Down, Left, Right,
Front or Back face clockwise as seen looking at that face, and U', D', ... counterclockwise.
Each turn is a permutation of the 24 stickers, built once from the cube's geometry
(`quarter_turn`); the tests check every one against a labelled cube turned by hand.

A 2×2 has no centres to say which colour belongs on which face, so the cube counts as solved
when each face is one colour, in whatever orientation the whole cube ends (`is_solved`).
A D turn leaves the cube as a U turn does, up to a turn of the whole cube about the up-down
axis (U with D' is that whole-cube turn); likewise L and R, B and F. The solver therefore
searches with U, R and F alone, which never move the down-back-left corner: a shortest
solution among these six turns is a shortest among all twelve, and the corner left in place
names the colour each face ends with (`goal`). `solve` is a breadth-first search from both ends, the
cube and its goal, and returns a shortest list of quarter turns; no pocket cube needs more
than 14 (`GODS_NUMBER`).

`scramble(seed, depth)` turns the solved cube `depth` times at random (`random.Random(seed)`,
the same on every machine and process), keeping each turn only if it takes the cube one turn
farther from solved, so the scramble's shortest solution has exactly `depth` turns: no turn
undoes the one before it, three turns of one face never collapse into one, and no shorter
way back exists at all.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from functools import lru_cache
from operator import itemgetter

from ragen.envs.base import (
    Demonstration,
    EpisodeBudget,
    ExpertError,
    ExpertMove,
    GenerationError,
    StepResult,
    action_lookup,
    check_int,
    info,
    match_action,
)

FACES = ("U", "L", "F", "R", "B", "D")  # the order of the faces in a cube string
FACE_NAMES = {"U": "Up", "L": "Left", "F": "Front", "R": "Right", "B": "Back", "D": "Down"}
COLOURS = {"W": "white", "O": "orange", "G": "green", "R": "red", "B": "blue", "Y": "yellow"}
OPPOSITE = {"W": "Y", "Y": "W", "O": "R", "R": "O", "G": "B", "B": "G"}
SOLVED = "WWWWOOOOGGGGRRRRBBBBYYYY"
ACTIONS = ("U", "U'", "D", "D'", "L", "L'", "R", "R'", "F", "F'", "B", "B'")

SOLVED_REWARD = 1.0  # the only reward, as in RAGEN-2: no step cost
# The deepest scramble: no cube is more than 14 turns from solved, but only 276 are 14 away
# and 90,280 are 13 away, so beyond 12 a random walk outward mostly dies short (`scramble`).
MAX_DEPTH = 12
MAX_WALKS = 100  # walks `scramble` tries before giving up
GODS_NUMBER = 14  # the most quarter turns any pocket cube needs to be solved

# Which way the columns (left to right) and the rows (top to bottom) of each face run, as one
# sees it looking straight at it, beside the face's outward normal. Axes: x to the right,
# y up, z toward the viewer of the Front face.
Vector = tuple[int, int, int]
_FRAMES: dict[str, tuple[Vector, Vector, Vector]] = {  # face: (normal, columns, rows)
    "U": ((0, 1, 0), (1, 0, 0), (0, 0, 1)),
    "L": ((-1, 0, 0), (0, 0, 1), (0, -1, 0)),
    "F": ((0, 0, 1), (1, 0, 0), (0, -1, 0)),
    "R": ((1, 0, 0), (0, 0, -1), (0, -1, 0)),
    "B": ((0, 0, -1), (-1, 0, 0), (0, -1, 0)),
    "D": ((0, -1, 0), (1, 0, 0), (0, 0, -1)),
}
# The down-back-left corner's stickers (Down bottom-left, Left bottom-left, Back bottom-right).
_DBL_DOWN, _DBL_LEFT, _DBL_BACK = 22, 6, 19
# The turns the solver uses: they keep the down-back-left corner in place (see the docstring).
SOLVER_MOVES = ("U", "U'", "R", "R'", "F", "F'")
# Scrambles of the worked turns shown to a small model (rollout.demos). Seeds from 2e9 up are
# never played: training seeds are below 1e9 and evaluation seeds are 1e9 + i. At every
# depth their solutions start by turning different faces, so the examples point to no fixed
# first action.
_DEMO_SEEDS = (2_000_000_014, 2_000_000_015)


def _stickers() -> list[tuple[Vector, Vector]]:
    """(cubie position, outward normal) of each sticker, in cube-string order; a cubie's
    coordinates are each -1 or 1."""
    stickers = []
    for normal, columns, rows in _FRAMES.values():
        for row in (-1, 1):
            for column in (-1, 1):
                x, y, z = (
                    n + column * c + row * r for n, c, r in zip(normal, columns, rows, strict=True)
                )
                stickers.append(((x, y, z), normal))
    return stickers


def _clockwise(v: Vector, axis: Vector) -> Vector:
    """`v` turned a quarter clockwise as seen looking from the tip of `axis` (a unit vector
    along x, y or z) toward the centre: Rodrigues' formula at -90°, (a·v) a - a × v."""
    (ax, ay, az), (vx, vy, vz) = axis, v
    along = ax * vx + ay * vy + az * vz
    cross = (ay * vz - az * vy, az * vx - ax * vz, ax * vy - ay * vx)
    return (along * ax - cross[0], along * ay - cross[1], along * az - cross[2])


_STICKERS = _stickers()


def quarter_turn(face: str) -> tuple[int, ...]:
    """The clockwise turn of `face` as a permutation: turned cube[i] = cube[perm[i]]."""
    axis = _FRAMES[face][0]
    index = {sticker: i for i, sticker in enumerate(_STICKERS)}
    perm = list(range(len(_STICKERS)))
    for i, (position, normal) in enumerate(_STICKERS):
        if position[0] * axis[0] + position[1] * axis[1] + position[2] * axis[2] > 0:
            perm[index[(_clockwise(position, axis), _clockwise(normal, axis))]] = i
    return tuple(perm)


def _then(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation of `first` followed by `second`."""
    return tuple(first[i] for i in second)


def _moves() -> dict[str, tuple[int, ...]]:
    """Every action's permutation: the clockwise turn, and three of them for the prime."""
    moves = {}
    for face in ("U", "D", "L", "R", "F", "B"):
        clockwise = quarter_turn(face)
        moves[face] = clockwise
        moves[f"{face}'"] = _then(_then(clockwise, clockwise), clockwise)
    return moves


MOVES = _moves()
_GATHER = {move: itemgetter(*perm) for move, perm in MOVES.items()}


def turn(cube: str, move: str) -> str:
    """`cube` after the quarter turn `move` (an action word, spelled as in ACTIONS)."""
    return "".join(_GATHER[move](cube))


def turns(cube: str, moves: Iterable[str]) -> str:
    """`cube` after each of `moves` in order."""
    for move in moves:
        cube = turn(cube, move)
    return cube


def inverse(move: str) -> str:
    """The turn that undoes `move`: U for U', U' for U."""
    return move[:-1] if move.endswith("'") else f"{move}'"


def is_solved(cube: str) -> bool:
    """Whether every face shows one colour (in any orientation of the whole cube)."""
    return all(cube[i] == cube[i + 1] == cube[i + 2] == cube[i + 3] for i in range(0, 24, 4))


def goal(cube: str) -> str:
    """The solved cube that U, R and F turns reach from `cube`: the down-back-left corner,
    which they never move, gives Down, Left and Back their colours, and Up, Right and Front
    take the opposite ones."""
    down, left, back = cube[_DBL_DOWN], cube[_DBL_LEFT], cube[_DBL_BACK]
    colour = {"D": down, "L": left, "B": back}
    colour.update(U=OPPOSITE[down], R=OPPOSITE[left], F=OPPOSITE[back])
    return "".join(colour[face] * 4 for face in FACES)


# One side of the bidirectional search: each cube seen, with the cube it was reached from and
# the turn between them (forward: parent, turn; backward: child, turn), None at the root.
_Seen = dict[str, tuple[str, str] | None]


def _grow(
    frontier: list[str], seen: _Seen, other: _Seen, backward: bool
) -> tuple[list[str], str | None]:
    """One more level of one side: the new frontier, and a cube the other side has seen (the
    meeting point), if one was reached."""
    following: list[str] = []
    for cube in frontier:
        for move in SOLVER_MOVES:
            # Backward, the new cube is the one this turn takes to `cube`.
            reached = turn(cube, inverse(move) if backward else move)
            if reached in seen:
                continue
            seen[reached] = (cube, move)
            if reached in other:
                return following, reached
            following.append(reached)
    return following, None


def solve(cube: str) -> list[str]:
    """A shortest list of quarter turns that solves `cube` (U, U', R, R', F, F' only: see the
    module docstring for why no shorter one uses the other six).

    Breadth-first from the cube and from its `goal` at once, a level at a time on the smaller
    side; the first cube both sides reach joins a shortest path (a shorter one would have met
    a level earlier). A cube 7 turns away takes about a millisecond, the farthest (14 turns)
    under half a second, as does a string that is no cube (both sides 7 levels deep).
    Raises ValueError for a string that no turns of a solved cube reach.
    """
    target = goal(cube)
    if cube == target:
        return []
    forward: _Seen = {cube: None}
    backward: _Seen = {target: None}
    ahead, behind, depth = [cube], [target], 0
    while depth < GODS_NUMBER:
        depth += 1
        if len(ahead) <= len(behind):
            ahead, meeting = _grow(ahead, forward, backward, backward=False)
        else:
            behind, meeting = _grow(behind, backward, forward, backward=True)
        if meeting is not None:
            return _path(forward, meeting)[::-1] + _path(backward, meeting)
    raise ValueError(
        f"{cube!r} is no pocket cube: no turns of a solved cube reach it (24 colour letters, "
        f"faces in the order {', '.join(FACE_NAMES[f] for f in FACES)})"
    )


def _path(seen: _Seen, cube: str) -> list[str]:
    """The turns between `cube` and the root of `seen`'s side, listed from `cube` on: on the
    forward side the solution's first turns, last first; on the backward side its last
    turns, in the order they are played."""
    moves = []
    step = seen[cube]
    while step is not None:
        cube, move = step
        moves.append(move)
        step = seen[cube]
    return moves


@lru_cache(maxsize=1024)
def scramble(seed: int, depth: int) -> tuple[str, ...]:
    """`depth` quarter turns of the solved cube whose shortest solution has exactly `depth`
    turns, the same for the same arguments on every machine and process.

    Each turn is the first, in an order drawn from `random.Random(seed)`, that takes the cube
    one turn farther from solved; every quarter turn changes the distance by exactly one (it
    is an odd permutation of the corners), so a turn that does not go farther comes closer.
    Some cubes from 8 turns out have no turn that goes farther; a walk that reaches one starts
    again from solved, drawing on the same stream (about 1 walk in 100 at depth 9, 1 in 8 at
    depth 12). Each candidate is measured with `solve` (its cost: docs/guide.md, "The 2×2
    cube"). Cached because a training batch resets a group of copies on the same seed.
    """
    check_int("seed", seed, 0)
    check_int("depth", depth, 1, MAX_DEPTH)
    rng = random.Random(seed)
    for _ in range(MAX_WALKS):
        walk = _outward_walk(rng, depth)
        if walk is not None:
            return walk
    raise GenerationError(  # 100 dead walks in a row: about 1 chance in 10**90 at depth 12
        f"seed {seed}: {MAX_WALKS} random walks all stopped short of depth {depth}"
    )


def _outward_walk(rng: random.Random, depth: int) -> tuple[str, ...] | None:
    """Turns that each take the cube one turn farther from solved, `depth` of them, or None
    when the walk reaches a cube from which no turn goes farther."""
    cube = SOLVED
    moves: list[str] = []
    while len(moves) < depth:
        for move in rng.sample(ACTIONS, len(ACTIONS)):
            turned = turn(cube, move)
            if len(solve(turned)) > len(moves):
                break
        else:
            return None
        cube = turned
        moves.append(move)
    return tuple(moves)


def render(cube: str) -> str:
    """The cube as the agent sees it: one line a face, its top row, `/`, its bottom row."""
    width = max(len(FACE_NAMES[face]) for face in FACES) + 1
    lines = []
    for k, face in enumerate(FACES):
        top_left, top_right, bottom_left, bottom_right = tuple(cube[4 * k : 4 * k + 4])
        name = f"{FACE_NAMES[face]}:"
        lines.append(f"{name:<{width}} {top_left} {top_right} / {bottom_left} {bottom_right}")
    return "\n".join(lines)


def _turn_words(move: str) -> str:
    """A turn and what it does: "R' (Right counterclockwise)"."""
    way = "counterclockwise" if move.endswith("'") else "clockwise"
    return f"{move} ({FACE_NAMES[move[0]]} {way})"


def solution_thought(cube: str, solution: list[str], count: int | None = None) -> str:
    """A true note on `cube` and its shortest `solution`: the colours the held corner gives
    each face, how far the cube is from solved and by which turns, and with `count`, where
    the first `count` turns (this turn's) leave it."""
    down, left, back = cube[_DBL_DOWN], cube[_DBL_LEFT], cube[_DBL_BACK]
    note = (
        f"The down-back-left corner has {down} on Down, {left} on Left and {back} on Back, so "
        f"Up, Right and Front end {OPPOSITE[down]}, {OPPOSITE[left]} and {OPPOSITE[back]}. "
        f"The cube is {len(solution)} {'turn' if len(solution) == 1 else 'turns'} from solved: "
        f"{', '.join(solution)}."
    )
    if count is None:
        return note
    moves = [_turn_words(move) for move in solution[:count]]
    named = moves[0] if count == 1 else f"{', '.join(moves[:-1])} and {moves[-1]}"
    rest = len(solution) - count
    if not rest:
        return f"{note} I turn {named}, which {'solves' if count == 1 else 'solve'} it."
    return f"{note} I turn {named}; {rest} {'turn remains' if rest == 1 else 'turns remain'}."


class Cube2Env:
    """Solve a 2×2 Rubik's cube scrambled `depth` quarter turns from solved (exactly that
    far: see `scramble`), within `max_actions` quarter turns.

    Rewards: +1 when every face shows one colour (which ends the episode), 0 for every other
    turn, as in RAGEN-2 (whose scramble of 5 random turns may undo itself; this one never
    does, so its depth 5 is 5 turns from solved). `expert` plays a shortest solution.
    """

    actions: tuple[str, ...] = ACTIONS

    def __init__(self, depth: int = 5, max_actions: int = 20) -> None:
        self.depth = check_int("depth", depth, 1, MAX_DEPTH)
        self._lookup = action_lookup(ACTIONS)
        self._budget = EpisodeBudget(max_actions)
        self._cube = ""
        self._text = ""

    def instructions(self) -> str:
        colours = ", ".join(f"{letter} {name}" for letter, name in COLOURS.items())
        return (
            "You are solving a 2×2 Rubik's cube. It is solved when each of its six faces shows "
            "one colour, whichever way the whole cube ends up.\n"
            f"Colours: {colours}; opposite faces end W and Y, O and R, G and B.\n"
            "Each line of the state is one face: its top row, /, its bottom row, as you see "
            "it looking straight at that face, with the Up face above the Front, Right, Back "
            "and Left faces, the Back face above the Up face, and the Front face above the "
            "Down face.\n"
            "Actions turn one face a quarter turn: U, D, L, R, F and B turn the Up, Down, "
            "Left, Right, Front or Back face clockwise as you look at that face; U', D', L', "
            "R', F' and B' turn it counterclockwise. Write each turn as its own action.\n"
            "Rewards: +1 when the cube is solved, 0 for every other turn.\n"
            f"Actions: {', '.join(ACTIONS)}."
        )

    def reset(self, seed: int) -> str:
        self._cube = turns(SOLVED, scramble(seed, self.depth))
        self._budget.start()
        self._text = render(self._cube)
        return self._text

    def step(self, action: str) -> StepResult:
        self._budget.spend()
        move = match_action(self._lookup, action)
        if move is None:
            truncated = self._budget.close(terminated=False)
            return StepResult(self._text, 0.0, False, truncated, info(False, False, False))
        # A turn moves the four corners of a layer, four pieces no two of which share their
        # colours, each to another's place: what the cube shows always changes.
        self._cube = turn(self._cube, move)
        solved = is_solved(self._cube)
        truncated = self._budget.close(terminated=solved)
        self._text = render(self._cube)
        reward = SOLVED_REWARD if solved else 0.0
        return StepResult(self._text, reward, solved, truncated, info(solved, True, True))

    def render(self) -> str:
        return self._text

    @property
    def cube(self) -> str:
        """The current cube string (see the module docstring)."""
        if not self._cube:
            raise RuntimeError("no cube yet: call reset(seed)")
        return self._cube

    def expert(self, limit: int, located: bool) -> ExpertMove:
        """The first `limit` turns of a shortest solution (`solve`), with a thought on the
        colours each face ends with, the distance from solved and where the turns leave it.
        `located` changes nothing: a cube has no rows and columns to place things by."""
        solution = solve(self.cube)
        if not solution:
            raise ExpertError("the cube is already solved: there is no turn to make")
        count = min(limit, len(solution))
        return ExpertMove(solution_thought(self.cube, solution, count), tuple(solution[:count]))

    demo_count = len(_DEMO_SEEDS)

    def demonstrations(self) -> tuple[Demonstration, ...]:
        """Worked first turns of two scrambles this env never deals (see `Demonstration`):
        each answer is the whole shortest solution (the rollout shows a turn's worth), the
        thought the expert's note on the cube and that solution."""
        worked = []
        for seed in _DEMO_SEEDS:
            other = Cube2Env(self.depth)
            observation = other.reset(seed)
            solution = solve(other.cube)
            thought = solution_thought(other.cube, solution)
            worked.append(
                Demonstration(other.instructions(), observation, thought, tuple(solution))
            )
        return tuple(worked)
