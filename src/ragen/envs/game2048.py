"""2048 (multi-turn, stochastic): slide the tiles of a 4×4 board to merge them into a target tile.

A move slides every tile as far as it goes toward one side; two tiles of one value that meet
merge into their sum, and a tile merges at most once a move, the pair nearest the side first
(``2 2 2 2`` Left is ``4 4 . .``; ``2 2 4 .`` Left is ``4 4 . .``, not ``8``). After a move
that changes the board a new tile appears on a uniformly drawn empty cell: a 2 with
probability 0.9, else a 4. The game starts with two such tiles. All of it is drawn from one
`random.Random(seed)`, consumed in play order, so the same seed and moves give the same game
on every machine and in every process.

Rewards follow RAGEN-2's (mll-lab-nu/RAGEN, ``game_2048``): a move whose merges make new
tiles summing to S earns ``0.1 · log2(1 + S)``; the log keeps one late merge of two 512s from
outweighing the hundreds of small merges that led to it. RAGEN-2 configures -0.1 for a move
that changes nothing but its log transform turns it into 0; here it costs the -0.1 the
instructions state. The episode ends in success when a merge makes the target tile (2048, or
the `target` option: 64 or 128 are within a small model's reach) and in failure when no move
changes the board; the action budget truncates it.

The board is a tuple of 16 ints in row-major order, 0 for an empty cell. The game's rules
are the pure functions `slide`, `move`, `spawn` and `can_move`; `expert_turn` is the expert
`ragen sft` imitates.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from ragen.envs.base import (
    Demonstration,
    EpisodeBudget,
    ExpertError,
    ExpertMove,
    StepResult,
    action_lookup,
    check_int,
    info,
    match_action,
)

ACTIONS = ("Up", "Down", "Left", "Right")
SIDE = 4
CELLS = SIDE * SIDE
START_TILES = 2
FOUR_PROBABILITY = 0.1  # a new tile is a 4 with this probability, else a 2
MERGE_SCALE = 0.1  # reward of a move: MERGE_SCALE * log2(1 + sum of the tiles its merges made)
INVALID_MOVE_REWARD = -0.1  # a move that changes nothing
MIN_TARGET, MAX_TARGET = 8, 2**17  # above a new tile's 4; the largest tile a 4×4 board can hold
EMPTY = "."

# The cells of each line a move slides, listed from the side the tiles slide toward.
LINES: dict[str, tuple[tuple[int, ...], ...]] = {
    "Left": tuple(tuple(range(r * SIDE, (r + 1) * SIDE)) for r in range(SIDE)),
    "Right": tuple(tuple(range((r + 1) * SIDE - 1, r * SIDE - 1, -1)) for r in range(SIDE)),
    "Up": tuple(tuple(range(c, CELLS, SIDE)) for c in range(SIDE)),
    "Down": tuple(tuple(range(CELLS - SIDE + c, -1, -SIDE)) for c in range(SIDE)),
}

# Boards of the worked turns shown to a small model (rollout.demos). Seeds from 2e9 up are
# never played: training seeds are below 1e9 and evaluation seeds are 1e9 + i. The expert
# opens these two with different moves (Left then Up; Up), so the examples point to no fixed
# move.
_DEMO_SEEDS = (2_000_000_002, 2_000_000_005)

Board = tuple[int, ...]


@dataclass(frozen=True)
class Merge:
    """Two tiles of `value` that one move merged into a tile of twice that: `cells` are where
    the two stood before the move, the one nearer the side the tiles slid toward first."""

    value: int
    cells: tuple[int, int]


@lru_cache(maxsize=65_536)
def slide(line: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[tuple[int, int, int], ...]]:
    """One line slid toward its index 0: the new line, and each merge as (value, i, j), the
    indices of the merged pair. Each tile merges at most once, the pair nearest index 0 first:
    (2, 2, 2, 2) gives (4, 4, 0, 0); (2, 2, 4, 0) gives (4, 4, 0, 0)."""
    tiles = [(i, v) for i, v in enumerate(line) if v]
    out: list[int] = []
    merges: list[tuple[int, int, int]] = []
    k = 0
    while k < len(tiles):
        (i, value), following = tiles[k], tiles[k + 1] if k + 1 < len(tiles) else None
        if following is not None and following[1] == value:
            out.append(2 * value)
            merges.append((value, i, following[0]))
            k += 2
        else:
            out.append(value)
            k += 1
    return (*out, *[0] * (len(line) - len(out))), tuple(merges)


def move(board: Board, action: str) -> tuple[Board, tuple[Merge, ...]]:
    """The board after sliding toward `action`'s side (no new tile yet), and its merges
    (line by line, nearest the side first). An unchanged board means the move is invalid."""
    cells = list(board)
    merges = []
    for line in LINES[action]:
        slid, pairs = slide(tuple(board[c] for c in line))
        for c, value in zip(line, slid, strict=True):
            cells[c] = value
        merges += [Merge(value, (line[i], line[j])) for value, i, j in pairs]
    return tuple(cells), tuple(merges)


def merge_reward(merges: Iterable[Merge]) -> float:
    """A move's reward: MERGE_SCALE · log2(1 + S), S the sum of the tiles its merges made."""
    return _sum_reward(sum(2 * m.value for m in merges))


def _sum_reward(merged_sum: int) -> float:
    return MERGE_SCALE * math.log2(1 + merged_sum)


def can_move(board: Board) -> bool:
    """Whether some move changes the board (else the game is lost)."""
    return any(move(board, action)[0] != board for action in ACTIONS)


def spawn(board: Board, rng: random.Random) -> Board:
    """`board` with a new tile on a uniformly drawn empty cell: 2 w.p. 0.9, else 4. Takes two
    floats from `rng` (cell, then value), so a game is a pure function of its seed and moves."""
    empty = [c for c, v in enumerate(board) if not v]
    cell = empty[int(rng.random() * len(empty))]
    value = 4 if rng.random() < FOUR_PROBABILITY else 2
    return (*board[:cell], value, *board[cell + 1 :])


def new_board(rng: random.Random) -> Board:
    """The opening board: START_TILES new tiles on an empty board."""
    board: Board = (0,) * CELLS
    for _ in range(START_TILES):
        board = spawn(board, rng)
    return board


def draw(board: Board) -> str:
    """The board as the agent sees it: one line per row, cells split by a space, `.` empty:
    ``2 . . 4``."""
    cells = [str(v) if v else EMPTY for v in board]
    return "\n".join(" ".join(cells[r * SIDE : (r + 1) * SIDE]) for r in range(SIDE))


def parse(text: str) -> Board:
    """A board drawn as `draw` draws it (for tests and hand-made positions)."""
    rows = [line.split() for line in text.strip().splitlines()]
    if len(rows) != SIDE or any(len(row) != SIDE for row in rows):
        raise ValueError(f"a 2048 board is {SIDE} lines of {SIDE} cells split by spaces")
    cells = [0 if cell == EMPTY else int(cell) for row in rows for cell in row]
    if any(v < 2 or v & (v - 1) for v in cells if v):
        raise ValueError("a 2048 tile is a power of two from 2 up, and `.` an empty cell")
    return tuple(cells)


def check_target(target: int) -> int:
    """`target` if it is a power of two from MIN_TARGET to MAX_TARGET, else a ValueError."""
    check_int("target", target, MIN_TARGET, MAX_TARGET)
    if target & (target - 1):
        raise ValueError(f"target must be a power of two (such as 64, 128 or 2048), got {target}")
    return int(target)


# --------------------------------------------------------------------------- expert

# The expert's evaluation of a board: the tiles weighted by a snake that falls from the
# top-left corner (row 1 left to right, row 2 right to left, ...), which keeps the large tiles
# in order along the top, plus a bonus per empty cell. A classic hand-made 2048 heuristic.
_SNAKE_ORDER = (0, 1, 2, 3, 7, 6, 5, 4, 8, 9, 10, 11, 15, 14, 13, 12)
_SNAKE_WEIGHT = tuple(
    2.0 ** (CELLS - 1 - _SNAKE_ORDER.index(cell)) / 2.0 ** (CELLS - 1) for cell in range(CELLS)
)
_EMPTY_BONUS = 2.0
# Moves one expert turn may hold. A move after the first is made without seeing the new
# tiles, so it is planned only if `greedy_move` picks it on every board they can make: up
# to 30 after one move, 900 after two (all enumerated).
MAX_PLAN = 3


def evaluate(board: Board) -> float:
    """The expert's score of a board: the snake-weighted tiles plus a bonus per empty cell."""
    empty = board.count(0)
    return sum(w * v for w, v in zip(_SNAKE_WEIGHT, board, strict=True)) + _EMPTY_BONUS * empty


def spawns(board: Board) -> list[tuple[float, Board]]:
    """Every board a new tile can make, with its probability."""
    empty = [c for c, v in enumerate(board) if not v]
    return [
        (p / len(empty), (*board[:c], value, *board[c + 1 :]))
        for c in empty
        for value, p in ((2, 1 - FOUR_PROBABILITY), (4, FOUR_PROBABILITY))
    ]


def greedy_move(board: Board) -> str | None:
    """The move whose board `evaluate` scores highest (ties in ACTIONS order); None when no
    move changes `board`."""
    best, best_value = None, -math.inf
    for action in ACTIONS:
        after, _ = move(board, action)
        if after != board and evaluate(after) > best_value:
            best, best_value = action, evaluate(after)
    return best


def expectimax_move(board: Board) -> str | None:
    """The expert's move: the one after which the best next move's evaluation, averaged over
    the new tile's cells and values, is highest (ties in ACTIONS order); None when no move
    changes `board`."""
    best, best_value = None, -math.inf
    for action in ACTIONS:
        after, _ = move(board, action)
        if after == board:
            continue
        value = 0.0
        for p, spawned in spawns(after):
            following = greedy_move(spawned)
            value += p * evaluate(move(spawned, following)[0] if following else spawned)
        if value > best_value:
            best, best_value = action, value
    return best


def expert_turn(board: Board, limit: int) -> tuple[str, ...]:
    """The expert's moves for one turn, at most `limit` (and MAX_PLAN): the expectimax move,
    then each move `greedy_move` would pick on every board the new tiles can make, while
    there is one. Raises ExpertError when no move changes `board`."""
    first = expectimax_move(board)
    if first is None:
        raise ExpertError("no move changes this 2048 board: the game is over")
    moves = [first]
    boards = {move(board, first)[0]}
    while len(moves) < min(limit, MAX_PLAN):
        boards = {spawned for b in boards for _, spawned in spawns(b)}
        picks = {greedy_move(b) for b in boards}
        action = picks.pop() if len(picks) == 1 else None
        if action is None:  # the boards disagree, or none can move
            break
        moves.append(action)
        boards = {move(b, action)[0] for b in boards}
    return tuple(moves)


def _cell(cell: int) -> str:
    row, col = divmod(cell, SIDE)
    return f"row {row + 1}, column {col + 1}"


def _describe_merge(merge: Merge, action: str, located: bool) -> str:
    """One merge in words: "2+2=4 in row 1", and with `located` the cells the pair stood on,
    "2+2=4 in row 1 (columns 1 and 3)" (rows for a move Left or Right, columns for Up or
    Down)."""
    (r1, c1), (r2, c2) = divmod(merge.cells[0], SIDE), divmod(merge.cells[1], SIDE)
    if action in ("Left", "Right"):
        line, cells = f"row {r1 + 1}", f"columns {min(c1, c2) + 1} and {max(c1, c2) + 1}"
    else:
        line, cells = f"column {c1 + 1}", f"rows {min(r1, r2) + 1} and {max(r1, r2) + 1}"
    words = f"{merge.value}+{merge.value}={2 * merge.value} in {line}"
    return f"{words} ({cells})" if located else words


def _join(items: list[str] | tuple[str, ...]) -> str:
    """Words listed as a sentence does: "a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


# At most this many merges are named one by one in a thought; the rest are counted.
_NAMED_MERGES = 2


def move_thought(board: Board, action: str, located: bool = False) -> str:
    """What `action` does to `board`, in words true of it: its merges (largest first), the
    empty cells it leaves (and whether that is the most any move leaves), and where the
    largest tile ends up: the expert keeps it in the top-left corner, as `evaluate` weighs."""
    after, merges = move(board, action)
    ranked = sorted(merges, key=lambda m: -m.value)
    named = [_describe_merge(m, action, located) for m in ranked[:_NAMED_MERGES]]
    more = len(merges) - len(named)
    if more:
        named.append(f"{more} more pair{'s' if more > 1 else ''}")
    what = f"{action} merges {_join(named) if merges else 'nothing'}"
    empty = after.count(0)
    others = [move(board, a)[0] for a in ACTIONS if a != action]
    most = all(o.count(0) <= empty for o in others if o != board)
    leaves = f"leaving {empty} empty cell{'s' if empty != 1 else ''}"
    leaves += ", the most of any move" if most else ""
    largest = max(after)
    if after.index(largest) == 0:
        where = "in the top-left corner, where I keep it"
    else:
        where = f"at {_cell(after.index(largest))}; I build toward the top-left corner"
    return f"{what}, {leaves}. The largest tile, {largest}, ends {where}."


def turn_thought(board: Board, moves: tuple[str, ...], located: bool = False) -> str:
    """The thought of an expert turn: what its first move does (`move_thought`), then the
    moves planned after it, which the expert picks wherever the new tiles appear."""
    thought = move_thought(board, moves[0], located)
    if len(moves) == 1:
        return thought
    tiles = "tile appears" if len(moves) == 2 else "tiles appear"
    return f"{thought} Then {_join(moves[1:])}, which I pick wherever the new {tiles}."


# --------------------------------------------------------------------------- environment


class Game2048Env:
    """2048 on a 4×4 board; actions Up, Down, Left, Right (see the module docstring).

    Options: target (the tile that wins, a power of two: 2048 by default; 64 or 128 measure
    a small model), max_actions (the action budget; the default leaves a good player about
    twice the moves 2048 takes).
    """

    actions: tuple[str, ...] = ACTIONS

    def __init__(self, target: int = 2048, max_actions: int = 2000) -> None:
        self.target = check_target(target)
        self._budget = EpisodeBudget(max_actions)
        self._lookup = action_lookup(ACTIONS)
        self._rng = random.Random(0)
        self._board: Board = ()
        self._text = ""

    def instructions(self) -> str:
        return (
            "You are playing 2048 on a 4x4 board. A move slides every tile as far as it goes "
            "toward one side; two tiles of the same value that meet merge into one tile of "
            "their sum, and a tile merges at most once per move. After each move that changes "
            "the board, a new tile appears on a random empty cell: a 2 (9 times in 10) or a 4. "
            f"You win by making a {self.target} tile; you lose when no move changes the "
            "board.\n"
            f"Symbols: a number is a tile, {EMPTY} an empty cell.\n"
            "Rewards: a move whose merges make tiles summing to S earns "
            f"{MERGE_SCALE:g} x log2(1 + S) (two 2s merged: S = 4, {_sum_reward(4):.2f}; two "
            f"64s: S = 128, {_sum_reward(128):.2f}), on a log scale so that one late big "
            "merge does not outweigh all the small ones before it; a move that changes "
            f"nothing costs {-INVALID_MOVE_REWARD:g}.\n"
            f"Actions: {', '.join(ACTIONS)}."
        )

    def reset(self, seed: int) -> str:
        check_int("seed", seed, 0)
        rng = random.Random(seed)
        return self._start(new_board(rng), rng)

    def load(self, board: Board, seed: int = 0) -> str:
        """Start an episode from `board` (16 cells, row-major, 0 empty); `seed` drives the
        new tiles."""
        board = tuple(board)
        if len(board) != CELLS or any(v < 0 or v == 1 or v & (v - 1) for v in board):
            raise ValueError(f"a 2048 board is {CELLS} cells, each 0 or a power of two from 2")
        return self._start(board, random.Random(check_int("seed", seed, 0)))

    def _start(self, board: Board, rng: random.Random) -> str:
        self._board, self._rng = board, rng
        self._budget.start()
        self._text = draw(board)
        return self._text

    def step(self, action: str) -> StepResult:
        self._budget.spend()
        word = match_action(self._lookup, action)
        if word is None:
            truncated = self._budget.close(terminated=False)
            return StepResult(self._text, 0.0, False, truncated, info(False, False, False))
        after, merges = move(self._board, word)
        if after == self._board:
            truncated = self._budget.close(terminated=False)
            return StepResult(
                self._text, INVALID_MOVE_REWARD, False, truncated, info(False, True, False)
            )
        reward = merge_reward(merges)
        won = max(after) >= self.target
        self._board = after if won else spawn(after, self._rng)
        terminated = won or not can_move(self._board)
        truncated = self._budget.close(terminated)
        self._text = draw(self._board)
        return StepResult(self._text, reward, terminated, truncated, info(won, True, True))

    def render(self) -> str:
        return self._text

    @property
    def board(self) -> Board:
        """The current board: 16 cells in row-major order, 0 for an empty one."""
        return self._board

    def expert(self, limit: int, located: bool) -> ExpertMove:
        """The expert's turn of at most `limit` moves (`expert_turn`) and its thought
        (`turn_thought`; `located` names merges by row and column)."""
        moves = expert_turn(self._board, limit)
        return ExpertMove(turn_thought(self._board, moves, located), moves)

    demo_count = len(_DEMO_SEEDS)

    def demonstrations(self) -> tuple[Demonstration, ...]:
        """Worked first turns of two boards this env never deals (see `Demonstration`): the
        expert's turn and thought."""
        worked = []
        for seed in _DEMO_SEEDS:
            other = Game2048Env(self.target)
            observation = other.reset(seed)
            turn = other.expert(MAX_PLAN, located=False)
            worked.append(
                Demonstration(other.instructions(), observation, turn.thought, turn.answer)
            )
        return tuple(worked)
