"""Text environments for multi-turn RL: Bandit, Sokoban, FrozenLake, Countdown, Sudoku,
2048 and a 2×2 cube.

    from ragen import envs
    env = envs.make("sokoban")
    print(env.reset(seed=3))          # the room as text
    result = env.step("Up")           # StepResult(observation, reward, terminated, ...)

`names()` lists ragen's games; each name is a game plus default options, and any option can
be overridden: `make("frozen-lake", size=6)`. `make` also builds your own TextEnv class,
`make("mymod:MyEnv")`, and those installed packages offer (`installed()`).
"""

from ragen.envs.bandit import BanditEnv
from ragen.envs.base import (
    ENTRY_POINT_GROUP,
    Demonstration,
    EnvSpec,
    EpisodeOverError,
    GenerationError,
    StepResult,
    TextEnv,
    anchor,
    check_name,
    demo_count,
    demonstrations,
    installed,
    make,
    names,
    register,
    spec,
)
from ragen.envs.countdown import CountdownEnv
from ragen.envs.cube2 import Cube2Env
from ragen.envs.frozen_lake import FrozenLakeEnv
from ragen.envs.game2048 import Game2048Env
from ragen.envs.gym import as_gymnasium
from ragen.envs.sokoban import SokobanEnv
from ragen.envs.sokoban_room import NEW_VOCAB
from ragen.envs.sudoku import SudokuEnv

register(
    "bandit",
    BanditEnv,
    "two arms; Dragon pays 1 w.p. 0.25, Phoenix always 0.15 (single turn)",
)
register(
    "bandit-rev",
    BanditEnv,
    "bandit with the payoffs swapped: Phoenix is the risky arm (against the names' meaning)",
    high_risk="Phoenix",
)
register(
    "bandit-test",
    BanditEnv,
    "bandit with unseen names: Trader pays 1 w.p. 0.25, Librarian always 0.15",
    arm_names=("Librarian", "Trader"),
    high_risk="Trader",
)
register("sokoban", SokobanEnv, "push 1 box onto its target in a 6×6 room (multi-turn)")
register(
    "sokoban-large",
    SokobanEnv,
    "push 2 boxes onto targets in an 8×8 room (multi-turn)",
    height=8,
    width=8,
    num_boxes=2,
    max_actions=200,
)
register(
    "sokoban-newvocab",
    SokobanEnv,
    "the sokoban rooms drawn with different symbols (vocabulary generalisation)",
    symbols=NEW_VOCAB,
)
register(
    "frozen-lake",
    FrozenLakeEnv,
    "cross a slippery random 4×4 lake to the goal without falling in a hole (multi-turn)",
)
register(
    "frozen-lake-8x8",
    FrozenLakeEnv,
    "frozen lake on a random 8×8 map",
    size=8,
    max_actions=200,
)
register(
    "countdown",
    CountdownEnv,
    "reach the target with +, -, ×, / using each of 3-4 numbers once (single turn)",
)
register(
    "2048",
    Game2048Env,
    "slide the tiles of a 4×4 board to merge them into a 2048 tile (multi-turn)",
)
register(
    "2048-64",
    Game2048Env,
    "2048 won at a 64 tile, within 100 actions: a target a small model can reach",
    target=64,
    max_actions=100,
)
register(
    "2048-128",
    Game2048Env,
    "2048 won at a 128 tile, within 200 actions",
    target=128,
    max_actions=200,
)
register(
    "cube2",
    Cube2Env,
    "solve a 2×2 Rubik's cube scrambled 5 quarter turns from solved (multi-turn)",
)
register(
    "sudoku",
    SudokuEnv,
    "fill a 9×9 Sudoku with 40% of its cells empty, one digit a step (multi-turn)",
)
register(
    "sudoku-4x4",
    SudokuEnv,
    "fill a 4×4 Sudoku (2×2 boxes, 6 cells empty), one digit a step (multi-turn)",
    size=4,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "BanditEnv",
    "CountdownEnv",
    "Cube2Env",
    "Demonstration",
    "EnvSpec",
    "EpisodeOverError",
    "FrozenLakeEnv",
    "Game2048Env",
    "GenerationError",
    "SokobanEnv",
    "StepResult",
    "SudokuEnv",
    "TextEnv",
    "anchor",
    "as_gymnasium",
    "check_name",
    "demo_count",
    "demonstrations",
    "installed",
    "make",
    "names",
    "register",
    "spec",
]
