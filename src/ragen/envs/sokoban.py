"""Sokoban (multi-turn, deterministic, irreversible): push every box onto a target.

The environment an agent plays: actions, rewards, the episode over a `Room`
(:mod:`ragen.envs.sokoban_room`) dealt by the seeded generator
(:mod:`ragen.envs.sokoban_levels`), and the worked turns shown to a small model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from ragen.envs.base import (
    Demonstration,
    EpisodeBudget,
    GenerationError,
    StepResult,
    action_lookup,
    check_bool,
    info,
    match_action,
)
from ragen.envs.sokoban_levels import (
    check_generator_options,
    check_room_options,
    generate_room,
    solve,
)
from ragen.envs.sokoban_room import (
    DEFAULT_SYMBOLS,
    LEGEND,
    SYMBOL_ROLES,
    Room,
    cell_distance,
    check_symbols,
    describe_coordinates,
    describe_offsets,
    draw,
    relative_cell,
)

ACTIONS = ("Up", "Down", "Left", "Right")

STEP_PENALTY = -0.1  # every action, effective or not: shorter solutions score higher
BOX_ON_TARGET = 1.0  # a box pushed onto a target (and minus this for one pushed off)
SOLVED_BONUS = 10.0

# Rooms of the worked turns shown to a small model (rollout.demos). Seeds from 2e9 up are
# never played: training seeds are below 1e9 and evaluation seeds are 1e9 + i. These two
# start with different moves in the 6×6 one-box room (Up, Right, Down: push the box down;
# Left, Left: push it left) and in the 8×8 two-box room (Down..., Left...), so the
# examples point to no fixed first action.
_DEMO_SEEDS = (2_000_000_000, 2_000_000_001)
# The sentence upstream's coordinate envs mean to add to their instructions (RAGEN-2 never
# appends it).
_COORD_HINT = "Coordinates are (row, col), counted from (0, 0) at the top-left.\n"


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
    (`describe_coordinates`). `offsets=True` adds a line under the grid with where each box
    lies from the player, the target it goes to from the box, and the walls beside the
    player (`describe_offsets`): what the push expert (`sft.sokoban_expert=push`) reads.
    `push_cells=True` (with ``offsets``) adds to it where the player pushes each box toward
    its target from (`push_cells_sentence`), so that the push expert's thought is copied
    from the line rather than computed from it.

    `swap_view=True` is the blind-play check: each episode plays the room of its seed but
    shows the room of the paired seed (``seed ^ 1``: an evaluation's seeds pair up), moved by
    the same valid actions (and left as it was once it is solved); rewards and the end are
    the played room's. A policy that reads the room it is shown loses most of its success;
    one that plays a fixed sequence loses none.
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
        offsets: bool = False,
        push_cells: bool = False,
        swap_view: bool = False,
    ) -> None:
        check_room_options(height, width, num_boxes)
        check_generator_options(carve_steps, pull_steps, max_tries)
        self.symbols = check_symbols(symbols)
        self.spaced = check_bool("spaced", spaced)
        self.coord = check_bool("coord", coord)
        self.offsets = check_bool("offsets", offsets)
        self.push_cells = check_bool("push_cells", push_cells)
        if push_cells and not offsets:
            raise ValueError("push_cells adds to the offsets line: set offsets=true as well")
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
        self._shown: SokobanEnv | None = None  # the paired room shown with swap_view
        if check_bool("swap_view", swap_view):
            self._shown = SokobanEnv(
                **self._generator_options,
                max_actions=max_actions,
                symbols=symbols,
                spaced=spaced,
                coord=coord,
                offsets=offsets,
                push_cells=push_cells,
            )

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
        if self._shown is not None:
            self._shown.reset(seed ^ 1)
        return self._begin(generate_room(seed, **self._generator_options))

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
                offsets=self.offsets,
                push_cells=self.push_cells,
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
        if self._shown is not None:
            raise ValueError(
                "swap_view shows the room of the seed paired with reset's, and load(room) "
                "has no seed: build the env without swap_view to load a room"
            )
        return self._begin(room)

    def _begin(self, room: Room) -> str:
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
        if self._shown is not None and not self._shown._budget.over:
            self._shown.step(move)
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
        with ``coord``, over the offsets line with ``offsets``."""
        room = self._room
        assert room is not None  # load() sets the room before any view
        if self._shown is not None:
            return self._shown.render()
        lines = [draw(room, self._boxes, self._player, self.symbols, self.spaced)]
        if self.coord:
            lines.insert(0, describe_coordinates(room, self._boxes, self._player))
        if self.offsets:
            lines.append(
                describe_offsets(room, self._boxes, self._player, self.symbols, self.push_cells)
            )
        return "\n".join(lines)

    def render(self) -> str:
        return self._text

    @property
    def num_boxes(self) -> int:
        """Boxes in every room this env deals."""
        return self._generator_options["num_boxes"]

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
