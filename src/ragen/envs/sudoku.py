"""Sudoku (multi-turn): fill the empty cells so every row, column and box holds each digit once.

RAGEN-2's Sudoku (mll-lab-nu/RAGEN at 20daedc, ragen/env/sudoku): a 9×9 grid with 40, 50 or
60% of its cells empty (easy, medium, hard), one move a step, written ``place 5 at row 2 col
3`` or ``(2,3,5)`` (row, column, digit, counted from 1 at the top-left), at most 81 moves (one
per cell), and its rewards: +1 for the right digit, +0.5 for a digit that fits its row, column
and box but is not the solution's, -0.1 for a move that breaks a rule (a number off the grid,
a filled cell, a digit already in the row, column or box), and +10 more for the move that
solves the grid. Three departures, where upstream pays for something other than solving or
its docs promise what its code does not do:

- every puzzle has one solution, checked by a solver: upstream's docstring promises it, but
  its code empties random cells unchecked, so the digit of another solution can pay +0.5;
- a filled cell cannot be changed: upstream protects only the givens, so placing, overwriting
  and placing again on one cell pays +1 or +0.5 every time;
- text that is not a move at all is a no-op that scores 0, as a non-word is in every ragen
  game (the env contract; upstream charges it -0.1).

The game ends with success when the grid is full (a full grid is the solution: no move may
repeat a digit in a row, column or box, so a full grid solves the puzzle, and the puzzle has
one solution), and with failure when an empty cell has no digit left that fits (a wrong digit
made the grid unsolvable: no move can finish it).

Puzzles: a full grid drawn by randomised backtracking, then its cells emptied in a random
order, each kept empty only while the puzzle still has exactly one solution (`count_solutions`
stops counting at 2), until the difficulty's share is empty. All randomness comes from
``random.Random(seed).random()``, the one method whose sequence Python promises to keep across
versions, so a seed names the same puzzle on every machine and in every process.

``size=4`` (registered as ``sudoku-4x4``) plays 4×4 grids of 2×2 boxes, as upstream's first
Sudoku did by default: 6 to 9 moves on a grid of about 57 tokens, where 9×9 takes 32 to 48
moves on one of about 210, more turns and context than a small model on a CPU gets.

The expert (`SudokuEnv.expert`) fills a forced cell, one a player can prove from the grid: a
naked single (the one digit its row, column and box leave) or a hidden single (the one cell of
a row, column or box where a digit fits), and says which in its thought. Singles finish every
4×4 puzzle the tests try and most 9×9 ones; where none is left (some hard 9×9 grids), it takes
the cell with the fewest digits left and the one of them that leaves the grid solvable
(`by_elimination`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import isqrt
from typing import NamedTuple

from ragen.envs.base import (
    Demonstration,
    EpisodeBudget,
    ExpertError,
    ExpertMove,
    GenerationError,
    StepResult,
    check_int,
    grid_cell,
    info,
)

SIZES = (4, 9)  # side of the grid; its boxes are 2×2 and 3×3
DIFFICULTIES = {"easy": 0.4, "medium": 0.5, "hard": 0.6}  # the share of cells left empty

RIGHT_REWARD = 1.0  # the digit of the solution
FITS_REWARD = 0.5  # a digit that breaks no rule but is not the solution's
BAD_REWARD = -0.1  # a move that breaks a rule: nothing changes
SOLVED_BONUS = 10.0  # added to the move that fills the last empty cell

EMPTY = "."
MAX_MOVE_CHARS = 100  # longer text is no move: the regexes never see it
# Puzzles of the worked turns shown to a small model (rollout.demos): seeds from 2e9 up are
# never played (training seeds are below 1e9, evaluation seeds 1e9 + i and 3e9 + i).
_DEMO_SEEDS = (2_000_000_001, 2_000_000_002)

_WORD = r"[0-9]{1,3}"
# "place 5 at row 2 col 3", "Place 5 at row 2, column 3" (digit first, as upstream writes it).
_PLACE = re.compile(
    rf"place\s+({_WORD})\s+(?:at\s+)?row\s+({_WORD})\s*,?\s*col(?:umn)?\s+({_WORD})",
    re.ASCII | re.IGNORECASE,
)
# "(2,3,5)", "(2, 3, 5)", "2,3,5": row, column, digit.
_TRIPLE = re.compile(rf"\(?\s*({_WORD})\s*,\s*({_WORD})\s*,\s*({_WORD})\s*\)?", re.ASCII)


class Move(NamedTuple):
    """A move as written: row, column and digit, counted from 1, not yet checked."""

    row: int
    col: int
    digit: int


@dataclass(frozen=True)
class Puzzle:
    """A puzzle and its one solution, row by row (cell ``row * size + col``; 0 is empty)."""

    size: int
    givens: tuple[int, ...]
    solution: tuple[int, ...]


# --------------------------------------------------------------------------- the grid


@lru_cache(maxsize=len(SIZES))
def units(size: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The cells of each row, column and box of a grid ``size`` wide: ``(rows, cols, boxes)``,
    boxes numbered in reading order."""
    side = isqrt(size)
    rows = tuple(tuple(range(r * size, (r + 1) * size)) for r in range(size))
    cols = tuple(tuple(range(c, size * size, size)) for c in range(size))
    boxes = tuple(
        tuple((top + r) * size + left + c for r in range(side) for c in range(side))
        for top in range(0, size, side)
        for left in range(0, size, side)
    )
    return rows, cols, boxes


def box_of(cell: int, size: int) -> int:
    """The box number of ``cell``, counted in reading order from 0."""
    side = isqrt(size)
    row, col = divmod(cell, size)
    return row // side * side + col // side


def seen(grid: Sequence[int], size: int, cell: int) -> set[int]:
    """The digits in the row, column and box of ``cell`` (its own digit included)."""
    rows, cols, boxes = units(size)
    row, col = divmod(cell, size)
    peers = (*rows[row], *cols[col], *boxes[box_of(cell, size)])
    return {grid[peer] for peer in peers} - {0}


def candidates(grid: Sequence[int], size: int, cell: int) -> tuple[int, ...]:
    """The digits that fit the empty ``cell``: none of its row, column and box holds them."""
    taken = seen(grid, size, cell)
    return tuple(d for d in range(1, size + 1) if d not in taken)


def stuck(grid: Sequence[int], size: int) -> bool:
    """Whether some empty cell has no digit left that fits (the grid cannot be finished)."""
    return any(not digit and not candidates(grid, size, cell) for cell, digit in enumerate(grid))


def draw(grid: Sequence[int], size: int) -> str:
    """The grid as the agent sees it: a header of column numbers, each row after its number,
    a space between cells, ``.`` for an empty one, and lines between the boxes::

            1 2   3 4
        1   . . | 3 1
        2   . . | 4 2
            ----+----
        3   4 1 | . 3
        4   3 . | 1 4
    """
    side = isqrt(size)

    def split(items: list[str], gap: str) -> str:
        return gap.join(" ".join(items[i : i + side]) for i in range(0, size, side))

    header = "    " + split([str(c + 1) for c in range(size)], "   ")
    # A rule runs under each box's cells and their spaces; "+" sits under each "|".
    rule = "    " + "+".join("-" * (2 * side + (0 < b < side - 1)) for b in range(side))
    lines = [header]
    for row in range(size):
        if row and row % side == 0:
            lines.append(rule)
        cells = [str(d) if d else EMPTY for d in grid[row * size : (row + 1) * size]]
        lines.append(f"{row + 1:<4}{split(cells, ' | ')}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- solver


def solve(
    grid: Sequence[int], size: int, limit: int = 2, rng: random.Random | None = None
) -> list[tuple[int, ...]]:
    """Up to ``limit`` solutions of ``grid`` (0 is empty), by backtracking: each time on the
    empty cell with the fewest digits left, trying them ascending (or, with ``rng``, in a
    random order: how a full grid is drawn). [] when the filled cells already repeat a digit.

    Each row, column and box keeps the digits it holds as a bit mask (bit d-1 for digit d),
    so a cell's candidates are one OR and one NOT.
    """
    full = (1 << size) - 1
    used = [0] * (3 * size)  # rows, then columns, then boxes
    cells = list(grid)
    empty = []
    for cell, digit in enumerate(cells):
        row, col = divmod(cell, size)
        masks = (row, size + col, 2 * size + box_of(cell, size))
        if not digit:
            empty.append((cell, masks))
            continue
        bit = 1 << (digit - 1)
        if any(used[m] & bit for m in masks):
            return []
        for m in masks:
            used[m] |= bit
    found: list[tuple[int, ...]] = []

    def free(masks: tuple[int, int, int]) -> int:
        return full & ~(used[masks[0]] | used[masks[1]] | used[masks[2]])

    def search(todo: list[tuple[int, tuple[int, int, int]]]) -> None:
        if not todo:
            found.append(tuple(cells))
            return
        best = min(range(len(todo)), key=lambda i: free(todo[i][1]).bit_count())
        cell, masks = todo[best]
        rest = todo[:best] + todo[best + 1 :]
        options = free(masks)
        digits = [d for d in range(1, size + 1) if options >> (d - 1) & 1]
        for digit in digits if rng is None else shuffled(digits, rng):
            bit = 1 << (digit - 1)
            for m in masks:
                used[m] |= bit
            cells[cell] = digit
            search(rest)
            for m in masks:
                used[m] ^= bit
            if len(found) >= limit:
                break
        cells[cell] = 0

    search(empty)
    return found


def count_solutions(grid: Sequence[int], size: int, limit: int = 2) -> int:
    """How many solutions ``grid`` has, counted up to ``limit`` (2 tells one from several)."""
    return len(solve(grid, size, limit))


# --------------------------------------------------------------------------- generator


def shuffled(items: Sequence[int], rng: random.Random) -> list[int]:
    """A random order of ``items`` (Fisher-Yates driven by ``rng.random()`` alone, whose
    sequence Python keeps across versions; `random.shuffle`'s may change)."""
    order = list(items)
    for i in range(len(order) - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        order[i], order[j] = order[j], order[i]
    return order


def blank_count(size: int, difficulty: str) -> int:
    """How many cells a puzzle of ``difficulty`` leaves empty: ⌊share × cells⌋ (9×9: 32, 40,
    48; 4×4: 6, 8, 9)."""
    return int(DIFFICULTIES[difficulty] * size * size)


def dig(solution: Sequence[int], size: int, blanks: int, rng: random.Random) -> tuple[int, ...]:
    """Empty cells of a full grid in a random order, each only if the puzzle keeps one
    solution, until ``blanks`` are empty; () when every cell was tried short of that."""
    grid = list(solution)
    emptied = 0
    for cell in shuffled(range(size * size), rng):
        if emptied == blanks:
            break
        grid[cell] = 0
        if count_solutions(grid, size) == 1:
            emptied += 1
        else:
            grid[cell] = solution[cell]
    return tuple(grid) if emptied == blanks else ()


def check_size(size: int) -> int:
    """``size`` as an int if Sudoku has that size; otherwise a ValueError naming the option."""
    if check_int("size", size, 1) not in SIZES:
        raise ValueError(f"size must be one of {', '.join(map(str, SIZES))}, got {size!r}")
    return int(size)


def check_difficulty(difficulty: str) -> str:
    """``difficulty`` if Sudoku has it; otherwise a ValueError naming the option."""
    if not isinstance(difficulty, str) or difficulty not in DIFFICULTIES:
        allowed = ", ".join(DIFFICULTIES)
        raise ValueError(f"difficulty must be one of {allowed}, got {difficulty!r}")
    return difficulty


@lru_cache(maxsize=512)
def generate_puzzle(seed: int, size: int = 9, difficulty: str = "easy") -> Puzzle:
    """The puzzle of ``seed``: a random full grid with ``blank_count(size, difficulty)`` cells
    emptied, whose one solution `count_solutions` has checked.

    Cached because a training batch resets a group of copies on the same seed. Digging
    reaches each difficulty's share on every seed the tests try (60% stays below the most a
    puzzle with one solution can leave empty, 12 of 16 cells and 64 of 81); were it ever to
    fall short, the seed raises GenerationError rather than dealing an easier puzzle.
    """
    check_int("seed", seed, 0)
    size, difficulty = check_size(size), check_difficulty(difficulty)
    rng = random.Random(seed)
    blanks = blank_count(size, difficulty)
    solution = solve((0,) * (size * size), size, 1, rng)[0]
    givens = dig(solution, size, blanks, rng)
    if not givens:
        raise GenerationError(
            f"seed {seed}: emptying cells of a {size}×{size} grid in a random order stopped "
            f"short of {blanks} with one solution; choose an easier difficulty"
        )
    return Puzzle(size, givens, solution)


# --------------------------------------------------------------------------- moves


def parse_move(text: str) -> Move | None:
    """The move ``text`` writes, or None when it writes none: ``place D at row R col C``
    (also ``column``, a comma before it, no ``at``) or ``(R,C,D)`` (with or without the
    parentheses), in any case, spaces and a final full stop allowed. Numbers are read as
    written, unchecked; only ASCII digits count, and text over MAX_MOVE_CHARS is no move."""
    if len(text) > MAX_MOVE_CHARS:
        return None
    written = text.strip().rstrip(".").rstrip()
    place = _PLACE.fullmatch(written)
    if place is not None:
        digit, row, col = map(int, place.groups())
        return Move(row, col, digit)
    triple = _TRIPLE.fullmatch(written)
    if triple is None or written.startswith("(") != written.endswith(")"):
        return None
    row, col, digit = map(int, triple.groups())
    return Move(row, col, digit)


def broken_rule(grid: Sequence[int], size: int, move: Move) -> str | None:
    """Why ``move`` cannot be played on ``grid``, or None when it can."""
    for what, number in (("row", move.row), ("column", move.col), ("digit", move.digit)):
        if not 1 <= number <= size:
            return f"{what} {number} is off the grid (1-{size})"
    cell = (move.row - 1) * size + move.col - 1
    where = f"row {move.row}, column {move.col}"
    if grid[cell]:
        return f"{where} is already filled"
    rows, cols, boxes = units(size)
    for unit, name in (
        (rows[move.row - 1], f"row {move.row}"),
        (cols[move.col - 1], f"column {move.col}"),
        (boxes[box_of(cell, size)], f"the box of {where}"),
    ):
        if any(grid[peer] == move.digit for peer in unit):
            return f"{move.digit} is already in {name}"
    return None


def move_reward(right: bool, solved: bool) -> float:
    """The reward of a move that breaks no rule: +1 for the solution's digit, +0.5 for
    another, and +10 more when it fills the last empty cell."""
    return (RIGHT_REWARD if right else FITS_REWARD) + (SOLVED_BONUS if solved else 0.0)


def write_move(move: Move) -> str:
    """The move in the words the expert answers with: ``place 5 at row 2 col 3``."""
    return f"place {move.digit} at row {move.row} col {move.col}"


# --------------------------------------------------------------------------- expert


@dataclass(frozen=True)
class Forced:
    """A move the grid forces, and why, in the words of the expert's thought."""

    move: Move
    reason: str


def listing(digits: Sequence[int]) -> str:
    """Digits in words: "5", "1 and 5", "1, 2 and 5"."""
    words = [str(d) for d in digits]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def naked_single(grid: Sequence[int], size: int) -> Forced | None:
    """The first empty cell in reading order whose row, column and box leave one digit."""
    for cell, digit in enumerate(grid):
        fits = () if digit else candidates(grid, size, cell)
        if len(fits) == 1:
            row, col = divmod(cell, size)
            reason = (
                f"Row {row + 1}, column {col + 1} sees {listing(sorted(seen(grid, size, cell)))} "
                f"in its row, column and box, so only {fits[0]} fits there."
            )
            return Forced(Move(row + 1, col + 1, fits[0]), reason)
    return None


def _unit_name(kind: int, index: int, size: int) -> tuple[str, str]:
    """How a thought names unit ``index`` of ``kind`` (0 rows, 1 columns, 2 boxes), and how
    it names a cell within it: by the other coordinate, or by both in a box."""
    if kind == 0:
        return f"Row {index + 1}", "column {col}"
    if kind == 1:
        return f"Column {index + 1}", "row {row}"
    side = isqrt(size)
    top, left = index // side * side + 1, index % side * side + 1
    box = f"The box of rows {top}-{top + side - 1}, columns {left}-{left + side - 1}"
    return box, "row {row}, column {col}"


def hidden_single(grid: Sequence[int], size: int) -> Forced | None:
    """The first digit a row, column or box (in that order, each in reading order) still
    needs and can take in one empty cell only."""
    fits = {cell: candidates(grid, size, cell) for cell, digit in enumerate(grid) if not digit}
    for kind, group in enumerate(units(size)):
        for index, unit in enumerate(group):
            for digit in range(1, size + 1):
                spots = [cell for cell in unit if digit in fits.get(cell, ())]
                if len(spots) != 1:  # a digit the unit holds fits none of its cells
                    continue
                row, col = divmod(spots[0], size)
                name, spot = _unit_name(kind, index, size)
                where = spot.format(row=row + 1, col=col + 1)
                reason = (
                    f"{name} still needs a {digit}, and {where} is its only empty cell where "
                    f"{digit} fits, so {digit} goes at row {row + 1}, column {col + 1}."
                )
                return Forced(Move(row + 1, col + 1, digit), reason)
    return None


def forced_move(grid: Sequence[int], size: int) -> Forced | None:
    """A move the grid forces: a naked single if there is one, else a hidden single; None
    when there is neither (a puzzle that needs more than singles from here)."""
    return naked_single(grid, size) or hidden_single(grid, size)


def by_elimination(grid: Sequence[int], puzzle: Puzzle) -> Forced:
    """The move of a player who has no single left (a hard 9×9 puzzle may need more): the
    empty cell with the fewest digits left, in reading order, and the one of them the grid
    can be finished with; each other digit there leaves the puzzle unsolvable, since its
    solution is unique (`count_solutions` checked it), which the thought says."""
    size = puzzle.size
    empty = [cell for cell, digit in enumerate(grid) if not digit]
    cell = min(empty, key=lambda c: len(candidates(grid, size, c)))
    digit, fits = puzzle.solution[cell], candidates(grid, size, cell)
    row, col = divmod(cell, size)
    others = [d for d in fits if d != digit]
    reason = (
        f"No cell is forced by a single. Row {row + 1}, column {col + 1} can take only "
        f"{listing(fits)}; with {listing(others)} there the grid has no solution, so "
        f"{digit} goes at row {row + 1}, column {col + 1}."
    )
    return Forced(Move(row + 1, col + 1, digit), reason)


# --------------------------------------------------------------------------- environment


class SudokuEnv:
    """Fill a seeded Sudoku grid, one digit a step; the action is free text, so `actions` is
    empty and `parse_move` reads it.

    Options: size (9, or 4 for 2×2 boxes), difficulty (easy, medium, hard: 40, 50, 60% of the
    cells empty), max_actions (the step budget; None: one step per cell, 81 on 9×9 as in
    RAGEN-2).
    """

    actions: tuple[str, ...] = ()

    def __init__(
        self,
        size: int = 9,
        difficulty: str = "easy",
        max_actions: int | None = None,
    ) -> None:
        self.size, self.difficulty = check_size(size), check_difficulty(difficulty)
        cells = self.size * self.size
        self._budget = EpisodeBudget(cells if max_actions is None else max_actions)
        self.puzzle = Puzzle(self.size, (), ())
        self._grid: list[int] = []
        self._text = ""

    def instructions(self) -> str:
        side = isqrt(self.size)
        return (
            f"You are solving a {self.size}×{self.size} Sudoku. Fill every empty cell ({EMPTY}) "
            f"with a digit from 1 to {self.size} so that every row, every column and every "
            f"{side}×{side} box holds each digit once. Rows and columns are numbered from 1 "
            "at the top-left; a filled cell cannot be changed.\n"
            f"Reward: +{RIGHT_REWARD:g} for the right digit, +{FITS_REWARD:g} for a digit "
            "that fits its row, column and box but is not the solution's, "
            f"{BAD_REWARD:g} for a move that breaks a rule (a filled cell, a digit already in "
            "its row, column or box, a number off the grid), and "
            f"+{SOLVED_BONUS:g} more for the move that solves the grid. Text that is not a "
            "move changes nothing and scores 0. The game ends when the grid is solved, or "
            "when an empty cell has no digit left that fits.\n"
            "Answer with one move: place 5 at row 2 col 3, or (2,3,5) for row 2, column 3, "
            "digit 5."
        )

    def reset(self, seed: int) -> str:
        return self.load(generate_puzzle(seed, self.size, self.difficulty))

    def load(self, puzzle: Puzzle) -> str:
        """Start an episode on a given puzzle (the tests' hand-made states)."""
        if puzzle.size != self.size:
            raise ValueError(f"a {puzzle.size}×{puzzle.size} puzzle in a size={self.size} env")
        self.puzzle = puzzle
        self._grid = list(puzzle.givens)
        self._text = draw(self._grid, self.size)
        self._budget.start()
        return self._text

    def step(self, action: str) -> StepResult:
        self._budget.spend()
        move = parse_move(action)
        if move is None:
            return self._result(0.0, False, info(False, False, False))
        error = broken_rule(self._grid, self.size, move)
        if error is not None:
            return self._result(BAD_REWARD, False, info(False, True, False, error=error))
        cell = (move.row - 1) * self.size + move.col - 1
        self._grid[cell] = move.digit
        self._text = draw(self._grid, self.size)
        solved = all(self._grid)
        right = move.digit == self.puzzle.solution[cell]
        terminated = solved or stuck(self._grid, self.size)
        details = info(solved, True, True, right_digit=right)
        return self._result(move_reward(right, solved), terminated, details)

    def _result(self, reward: float, terminated: bool, details: dict) -> StepResult:
        truncated = self._budget.close(terminated)
        return StepResult(self._text, reward, terminated, truncated, details)

    def render(self) -> str:
        return self._text

    @property
    def grid(self) -> tuple[int, ...]:
        """The cells now, row by row (0 is empty)."""
        return tuple(self._grid)

    def expert(self, limit: int, located: bool) -> ExpertMove:
        """One forced move from the current grid (`forced_move`, else `by_elimination`),
        whatever ``limit`` (a free-text answer is one move); ``located`` changes nothing, as
        every thought names rows and columns. Raises ExpertError on a grid with a wrong
        digit (it cannot be finished) or none empty."""
        wrong = [c for c, d in enumerate(self._grid) if d and d != self.puzzle.solution[c]]
        if wrong:
            where = grid_cell(wrong[0], self.size)
            raise ExpertError(f"this Sudoku grid has a wrong digit at {where}: it cannot be solved")
        if all(self._grid):
            raise ExpertError("this Sudoku grid has no empty cell: there is no move to make")
        forced = forced_move(self._grid, self.size) or by_elimination(self._grid, self.puzzle)
        return ExpertMove(forced.reason, (write_move(forced.move),))

    demo_count = len(_DEMO_SEEDS)

    def demonstrations(self) -> tuple[Demonstration, ...]:
        """Worked first moves of two puzzles this env never deals (see `Demonstration`): the
        expert's forced move, and its reason as the thought."""
        worked = []
        for seed in _DEMO_SEEDS:
            other = SudokuEnv(self.size, self.difficulty)
            observation = other.reset(seed)
            move = other.expert(1, located=False)
            worked.append(
                Demonstration(other.instructions(), observation, move.thought, move.answer)
            )
        return tuple(worked)
