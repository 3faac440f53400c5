"""A grid maze: a worked example of an environment written outside ragen.

    from ragen import envs
    env = envs.make("maze:MazeEnv")   # with this folder on sys.path (PYTHONPATH)
    print(env.reset(seed=0))

Each level is a pure function of its seed (`generate`): a randomised depth-first search
carves the corridors, so every floor cell is reachable, and the start and the goal are two
different rooms drawn from the same seed. The player moves one cell per action; a move into
a wall is a valid action that changes nothing. Reaching the goal pays 1 and ends the
episode; the action budget (`max_actions`) truncates it. See
docs/guides/adding-an-environment.md.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from ragen.envs.base import (
    Demonstration,
    EpisodeBudget,
    StepResult,
    action_lookup,
    check_int,
    info,
    match_action,
    relative_position,
)

ACTIONS = ("Up", "Down", "Left", "Right")
MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}  # (d_row, d_col)
WALL, FLOOR, PLAYER, GOAL = "#", ".", "P", "G"
# Mazes of the worked turns shown to a small model: ragen trains on seeds below 1e9 and
# evaluates on 1e9 + i, so these are never played.
DEMO_SEEDS = (2_000_000_001, 2_000_000_002)

Cell = tuple[int, int]  # (row, column) in the text grid


@dataclass(frozen=True)
class Maze:
    """One level: walls and floor, where the player starts, where the goal is, and a
    shortest way there (which makes every level provably solvable)."""

    rows: tuple[str, ...]  # WALL and FLOOR characters only
    start: Cell
    goal: Cell
    solution: tuple[str, ...]  # action words from start to goal, as few as possible


def _ways(rows: tuple[str, ...], start: Cell) -> dict[Cell, tuple[str, ...]]:
    """A shortest action sequence from ``start`` to every floor cell (breadth-first)."""
    ways: dict[Cell, tuple[str, ...]] = {start: ()}
    queue = deque([start])
    while queue:
        row, col = queue.popleft()
        for word, (d_row, d_col) in MOVES.items():
            cell = (row + d_row, col + d_col)
            if rows[cell[0]][cell[1]] != WALL and cell not in ways:
                ways[cell] = (*ways[(row, col)], word)
                queue.append(cell)
    return ways


def generate(seed: int, rooms: int = 3) -> Maze:
    """The maze of ``seed``: ``rooms`` × ``rooms`` rooms joined by corridors, drawn as a
    (2 × rooms + 1)-character square with a wall all round. Same seed, same maze."""
    side = 2 * rooms + 1
    grid = [[WALL] * side for _ in range(side)]
    rng = random.Random(seed)  # Python's Mersenne Twister: the same stream on every machine
    grid[1][1] = FLOOR
    stack = [(1, 1)]
    while stack:  # carve from the newest room into a random unvisited neighbour, or go back
        row, col = stack[-1]
        unvisited = [
            (d_row, d_col)
            for d_row, d_col in MOVES.values()
            if 0 < row + 2 * d_row < side
            and 0 < col + 2 * d_col < side
            and grid[row + 2 * d_row][col + 2 * d_col] == WALL
        ]
        if not unvisited:
            stack.pop()
            continue
        d_row, d_col = rng.choice(unvisited)
        grid[row + d_row][col + d_col] = grid[row + 2 * d_row][col + 2 * d_col] = FLOOR
        stack.append((row + 2 * d_row, col + 2 * d_col))
    rows = tuple("".join(line) for line in grid)
    start, goal = rng.sample(
        [(2 * r + 1, 2 * c + 1) for r in range(rooms) for c in range(rooms)], 2
    )
    return Maze(rows, start, goal, _ways(rows, start)[goal])


class MazeEnv:
    """Walk through a seeded grid maze to the goal (multi-turn)."""

    actions = ACTIONS
    demo_count = len(DEMO_SEEDS)  # known without building the worked turns

    def __init__(self, rooms: int = 3, max_actions: int = 20) -> None:
        # One room holds no maze; past 20 (a 41×41 grid) the text crowds a small context.
        self.rooms = check_int("rooms", rooms, 2, 20)
        self.max_actions = max_actions
        self._budget = EpisodeBudget(max_actions)  # checks max_actions >= 1
        self._lookup = action_lookup(ACTIONS)
        self._maze: Maze | None = None
        self._player = (0, 0)

    def instructions(self) -> str:
        return (
            f"You are in a maze drawn as text: {WALL} wall, {FLOOR} floor, {PLAYER} you, "
            f"{GOAL} the goal. Each action moves you one cell: {', '.join(ACTIONS)}. "
            f"Moving into a wall does nothing. Reach {GOAL} within {self.max_actions} actions."
        )

    def reset(self, seed: int) -> str:
        self._maze = generate(check_int("seed", seed, 0), self.rooms)
        self._player = self._maze.start
        self._budget.start()
        return self.render()

    def step(self, action: str) -> StepResult:
        self._budget.spend()  # raises EpisodeOverError before reset and after the end
        assert self._maze is not None  # reset made it: the budget allows no step before
        word = match_action(self._lookup, action)
        moved = False
        if word is not None:
            d_row, d_col = MOVES[word]
            cell = (self._player[0] + d_row, self._player[1] + d_col)
            if self._maze.rows[cell[0]][cell[1]] != WALL:  # the outer wall keeps cells inside
                self._player, moved = cell, True
        success = self._player == self._maze.goal
        truncated = self._budget.close(terminated=success)
        reward = 1.0 if success else 0.0
        return StepResult(
            self.render(), reward, success, truncated, info(success, word is not None, moved)
        )

    def render(self) -> str:
        if self._maze is None:
            return ""
        grid = [list(row) for row in self._maze.rows]
        grid[self._maze.goal[0]][self._maze.goal[1]] = GOAL
        grid[self._player[0]][self._player[1]] = PLAYER
        return "\n".join("".join(line) for line in grid)

    def demonstrations(self) -> tuple[Demonstration, ...]:
        """Worked first turns on unplayed mazes: the reply format, shown by example."""
        return tuple(self._demonstration(seed) for seed in DEMO_SEEDS)

    def _demonstration(self, seed: int) -> Demonstration:
        other = MazeEnv(self.rooms, self.max_actions)
        observation = other.reset(seed)
        maze = generate(seed, self.rooms)
        where = relative_position(maze.goal[0] - maze.start[0], maze.goal[1] - maze.start[1], "me")
        thought = f"G is {where}. Following the open cells, the way starts {maze.solution[0]}."
        return Demonstration(other.instructions(), observation, thought, maze.solution)
