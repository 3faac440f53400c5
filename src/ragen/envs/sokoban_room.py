"""The Sokoban room: its state (`Room`: the map, the boxes and the player), the symbols that
draw it and the drawings an agent reads (the grid, RAGEN-2's coordinate block), and where
cells lie from each other in words.

Cells are indexed row-major (`row * width + col`). The border is always wall, so a move
from any floor cell stays on the grid and needs no bounds check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ragen.envs.base import relative_position

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
        return draw(self, self.boxes, self.player, symbols, spaced)

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


def draw(
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


# The cells beside one, in the order of the env's actions (Up, Down, Left, Right), as row
# and column steps.
SIDE_STEPS = ((-1, 0), (1, 0), (0, -1), (0, 1))


PUSH_FROM = {"Up": "below", "Down": "above", "Left": "right of", "Right": "left of"}
"""Where the player stands to push a box each way, from the box."""


def describe_offsets(
    room: Room,
    boxes: Iterable[int],
    player: int,
    symbols: Mapping[str, str],
    push_cells: bool = False,
) -> str:
    """Where things lie from the player, so that a model need not count cells: each box off a
    target (reading order) and the free target nearest it (`cell_distance`, then the lower
    index), then the walls beside the player, in action order. One box: "The box X is 1
    above and 2 left of you; the target O is 2 below it. Walls # are 1 above you and 1
    right of you." More: "A box X is …; the nearest free target O is … it." each.
    ``push_cells`` adds after each box where the player pushes it toward its target from
    (`push_cells_sentence`)."""
    width, boxes = room.width, set(boxes)
    loose = sorted(boxes - room.targets)
    free = room.targets - boxes
    sentences = []
    for box in loose:
        target = min(free, key=lambda t: (cell_distance(box, t, width), t))
        where_box = relative_cell(player, box, width, "you")
        where_target = relative_cell(box, target, width, "it")
        if len(boxes) == 1:
            sentences.append(
                f"The box {symbols['box']} is {where_box}; the target {symbols['target']} "
                f"is {where_target}."
            )
        else:
            sentences.append(
                f"A box {symbols['box']} is {where_box}; the nearest free target "
                f"{symbols['target']} is {where_target}."
            )
        if push_cells:
            sentences.append(push_cells_sentence(box, target, player, width))
    if not loose:
        sentences.append("Every box is on a target.")
    sentences.append(walls_beside(room, player, symbols))
    return " ".join(sentences)


def push_cells_sentence(box: int, target: int, player: int, width: int) -> str:
    """Where the player pushes ``box`` toward ``target`` from, for each of the (one or two)
    directions that bring it nearer, the vertical first, each cell from the player: "It goes
    Down from the cell above it, 1 right of you, or Left from the cell right of it, 1 below
    and 2 right of you." (", where you stand" for the player's own cell). Geometry only: a
    cell may be a wall, and which way to push is left to the reader."""
    d_row = target // width - box // width
    d_col = target % width - box % width
    pushes = []
    if d_row:
        pushes.append(("Down", width) if d_row > 0 else ("Up", -width))
    if d_col:
        pushes.append(("Right", 1) if d_col > 0 else ("Left", -1))
    clauses = []
    for push, step in pushes:
        cell = box - step
        where = "where you stand" if cell == player else relative_cell(player, cell, width, "you")
        clauses.append(f"{push} from the cell {PUSH_FROM[push]} it, {where}")
    return f"It goes {', or '.join(clauses)}."


def walls_beside(room: Room, cell: int, symbols: Mapping[str, str]) -> str:
    """The walls next to ``cell``, in action order: "No wall is beside you.", "A wall # is 1
    above you." or "Walls # are 1 above you and 1 right of you."."""
    width = room.width
    walls = [
        relative_position(d_row, d_col, "you")
        for d_row, d_col in SIDE_STEPS
        if not room.floor[cell + d_row * width + d_col]
    ]
    wall = symbols["wall"]
    if not walls:
        return "No wall is beside you."
    if len(walls) == 1:
        return f"A wall {wall} is {walls[0]}."
    return f"Walls {wall} are {', '.join(walls[:-1])} and {walls[-1]}."


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


def relative_cell(origin: int, cell: int, width: int, anchor: str) -> str:
    """Where ``cell`` lies from ``origin`` in a room ``width`` wide, in words ("1 below me")."""
    (row, col), (o_row, o_col) = divmod(cell, width), divmod(origin, width)
    return relative_position(row - o_row, col - o_col, anchor)


def cell_distance(a: int, b: int, width: int) -> int:
    """Moves between two cells of a room ``width`` wide, walls ignored (Manhattan distance)."""
    (a_row, a_col), (b_row, b_col) = divmod(a, width), divmod(b, width)
    return abs(a_row - b_row) + abs(a_col - b_col)
