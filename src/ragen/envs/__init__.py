"""Text environments for multi-turn RL: Bandit, Sokoban, FrozenLake, Countdown.

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
from ragen.envs.frozen_lake import FrozenLakeEnv
from ragen.envs.gym import as_gymnasium
from ragen.envs.sokoban import NEW_VOCAB, SokobanEnv

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

__all__ = [
    "ENTRY_POINT_GROUP",
    "BanditEnv",
    "CountdownEnv",
    "Demonstration",
    "EnvSpec",
    "EpisodeOverError",
    "FrozenLakeEnv",
    "GenerationError",
    "SokobanEnv",
    "StepResult",
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
