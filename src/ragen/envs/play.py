"""Play an environment in the terminal: what `ragen envs` and `ragen play` run.

`play` reads action words from `read` and writes through `write`, so tests (and docs) can
drive it with a script instead of a keyboard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ragen.envs.base import ENTRY_POINT_GROUP, StepResult, installed, make, names, spec

QUIT_WORDS = frozenset({"quit", "exit", "q"})


def describe_envs() -> str:
    """One line per environment: each registered name and what it is, then each one an
    installed package offers and the class it names (read from metadata, not imported)."""
    lines = {name: spec(name).description for name in names()}
    for name, target in installed().items():
        lines.setdefault(name, f"{target} (a {ENTRY_POINT_GROUP} entry point)")
    width = max(map(len, lines))
    return "\n".join(f"{name:<{width}}  {text}" for name, text in lines.items())


def split_actions(text: str) -> list[str]:
    """The actions of a ``--actions`` string: split on ``||`` and on commas outside
    parentheses, so Sudoku's ``(2,3,5)`` stays one action; blanks are dropped.

    ``"Up,Left || Down"`` -> ``["Up", "Left", "Down"]``;
    ``"(2,3,5), (1,1,4)"`` -> ``["(2,3,5)", "(1,1,4)"]``.
    """
    actions: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text.replace("||", ","):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        if char == "," and depth == 0:
            actions.append("".join(current))
            current = []
        else:
            current.append(char)
    actions.append("".join(current))
    return [action.strip() for action in actions if action.strip()]


def _report(step: int, action: str, result: StepResult, total: float) -> str:
    valid = "" if result.info["action_valid"] else " (not a valid action: nothing happened)"
    status = "terminated" if result.terminated else "truncated" if result.truncated else "running"
    return (
        f"step {step}: {action!r}{valid}  reward {result.reward:+.2f}  return {total:+.2f}  "
        f"{status}\n{result.observation}"
    )


def _ending(result: StepResult, total: float) -> str:
    outcome = "success" if result.info["success"] else "no success"
    reason = "the game ended" if result.terminated else "the action budget ran out"
    return f"episode over ({reason}): {outcome}, return {total:+.2f}"


def play(
    name: str,
    seed: int = 0,
    actions: Sequence[str] | None = None,
    *,
    read: Callable[[str], str] = input,
    write: Callable[[str], None] = print,
) -> int:
    """Play `name` on `seed`; returns the process exit code, 0 once the game was played.

    With `actions`, plays that fixed sequence and prints every step; otherwise reads one
    action word per line from `read` until the episode ends, `quit`, or end of input.
    An unknown name raises ValueError listing the allowed names.
    """
    spec(name)  # the unknown-name error, before anything is printed
    env = make(name)
    write(env.instructions())
    write(f"\n{name}, seed {seed}:\n{env.reset(seed)}")
    script = iter(actions) if actions is not None else None
    total, step = 0.0, 0
    while True:
        if script is not None:
            action = next(script, None)
            if action is None:
                write("no more actions; the episode is still running")
                return 0
        else:
            try:
                action = read("action> ")
            except EOFError:
                write("")
                return 0
            if action.strip().casefold() in QUIT_WORDS:
                return 0
        step += 1
        result = env.step(action)
        total += result.reward
        write(_report(step, action, result, total))
        if result.done:
            write(_ending(result, total))
            if script is not None and (rest := list(script)):
                write(f"ignored after the end: {', '.join(rest)}")
            return 0
