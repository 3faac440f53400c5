"""The text-environment contract, the registry, and small helpers every game shares.

A ragen environment is text in, text out: `reset(seed)` returns the first observation,
`step(action_word)` returns a `StepResult`. Terminated and truncated are kept apart as in
gymnasium: *terminated* means the game reached an end state (solved, fell in a hole, pulled
an arm); *truncated* means a budget stopped it. The rollout code relies on that split to
count truncation honestly.

Every name in the registry maps to a factory plus default options, so `make("sokoban-large")`
and `make("sokoban", height=8, width=8, num_boxes=2)` build the same game. `make` and `spec`
also take an env from outside ragen, imported only then: `package.module:Class` names a
TextEnv class, and an installed package can name one in the `ragen.envs` entry-point group.
`check_name` judges a name without importing anything, as checking a config must.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from numbers import Integral, Real
from typing import Any, Protocol, runtime_checkable

from ragen.user_code import import_name, is_import_name

# Keys every `StepResult.info` carries. The rollout and the metrics read them, so an env
# that forgets one fails the conformance checker rather than a training run.
INFO_KEYS = ("success", "action_valid", "action_effective")


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one `TextEnv.step` returns.

    observation: the state as text (the same text `render()` gives after the step).
    reward: the reward of this single action.
    terminated: the episode reached an end state of the game.
    truncated: the episode was stopped by a budget (`max_actions`), not by the game.
    info: at least `success`, `action_valid`, `action_effective` (all bool).
    """

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    @property
    def done(self) -> bool:
        """True when the episode is over for either reason."""
        return self.terminated or self.truncated


@runtime_checkable
class TextEnv(Protocol):
    """A game that talks in text.

    `actions` lists the valid action words (matched case-insensitively). It is empty for a
    game whose action is free text, such as a Countdown expression.
    """

    actions: tuple[str, ...]

    def instructions(self) -> str:
        """Rules, symbol legend and the action list, written for the agent."""
        ...

    def reset(self, seed: int) -> str:
        """Start an episode; the same seed gives the same initial state on every machine."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply one action word; an invalid word is a no-op with `action_valid` False."""
        ...

    def render(self) -> str:
        """The current state as text."""
        ...


@dataclass(frozen=True, slots=True)
class Demonstration:
    """A worked first turn of another instance of a game, for few-shot prompting.

    A small model copies a filled-in reply far more readily than it follows a format rule:
    the 135M default writes `<think>...</think><answer>...</answer>` in about 1 reply of 50
    on Bandit from the rule alone, and in most replies once it has seen two worked turns.
    A demonstration uses names and states the real episodes never show, and no reward, so it
    teaches the format and not the answer.

    instructions: the game's rules, as `instructions()` would write them for this instance.
    observation: the first state of this instance.
    thought: the think text of the worked reply.
    answer: the action words of the worked reply (one free-text answer for a free-text game).
        It may hold more words than one turn allows: the rollout shows the first
        `max_actions_per_turn` of them, so one demonstration fits every preset.
    """

    instructions: str
    observation: str
    thought: str
    answer: tuple[str, ...]


def demonstrations(env: TextEnv) -> tuple[Demonstration, ...]:
    """The worked turns an env offers (an optional `demonstrations()` method); () if none."""
    offer = getattr(env, "demonstrations", None)
    return tuple(offer()) if callable(offer) else ()


def anchor(env: TextEnv, observation: str) -> str | None:
    """The history-free key of the env's current state (GiGPO's anchor state), from an
    optional `anchor()` method; None when the env has none, and the observation it rendered
    is the key. Turns of one group with equal keys acted from the same state."""
    method = getattr(env, "anchor", None)
    if not callable(method):
        return None
    key = method()
    return None if key == observation else str(key)


def demo_count(env: TextEnv) -> int:
    """How many worked turns `demonstrations(env)` gives (an env's ``demo_count``, 0 if it
    offers none), known without building them: building may run a solver."""
    return int(getattr(env, "demo_count", 0))


@dataclass(frozen=True)
class ExpertMove:
    """One turn of expert play: the think text and the action words (one free-text answer
    for a free-text game). An env may offer its own expert as a method
    ``expert(limit: int, located: bool) -> ExpertMove``: the turn of at most ``limit``
    actions a perfect player makes from the current state (``located``: the thought gives
    rows and columns first), which `ragen sft` then trains on."""

    thought: str
    answer: tuple[str, ...]


class ExpertError(ValueError):
    """The env has no expert, or its expert cannot move from this state."""


class EpisodeOverError(RuntimeError):
    """`step` was called before `reset` or after the episode ended."""


class GenerationError(RuntimeError):
    """A level generator gave up after its bounded number of attempts."""


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class EnvSpec:
    """One registered name: how to build it and what it is, in one line."""

    name: str
    factory: Callable[..., TextEnv]
    description: str
    defaults: dict[str, Any] = field(default_factory=dict)


_REGISTRY: dict[str, EnvSpec] = {}
ENTRY_POINT_GROUP = "ragen.envs"
# The TextEnv members a class must define; `actions` is often set per instance, so it is
# looked for on the built env only. (Python 3.11 offers no public list of a protocol's members.)
_METHODS = ("instructions", "reset", "step", "render")
# Entry-point envs already imported: the rollout builds an env per episode, and reading the
# installed packages' metadata each time costs milliseconds (more with many packages).
_INSTALLED: dict[str, EnvSpec] = {}


def register(name: str, factory: Callable[..., TextEnv], description: str, **defaults: Any) -> None:
    """Add `name` to the registry; `defaults` are options the caller may still override."""
    if name in _REGISTRY:
        raise ValueError(f"environment name {name!r} is already registered")
    _REGISTRY[name] = EnvSpec(name, factory, description, dict(defaults))


def names() -> list[str]:
    """Every registered environment name, in registration order."""
    return list(_REGISTRY)


def installed() -> dict[str, str]:
    """The envs installed packages offer in the `ragen.envs` entry-point group, name →
    `package.module:Class`, read from their metadata (nothing is imported)."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def check_name(name: str) -> None:
    """Raise the unknown-name ValueError unless `name` is registered, installed, or has the
    shape `package.module:Class`; nothing is imported, so checking a config runs no user code."""
    if name not in _REGISTRY and not is_import_name(name) and name not in installed():
        raise _unknown(name)


def _unknown(name: str) -> ValueError:
    allowed = ", ".join([*names(), *installed()])
    return ValueError(
        f"unknown environment {name!r}; allowed names: {allowed}, "
        "or package.module:Class naming your own TextEnv class"
    )


def spec(name: str) -> EnvSpec:
    """The entry of `name`: a registered name, an installed `ragen.envs` entry point, or
    `package.module:Class` (the last two imported here: user code runs).

    Raises ValueError listing the known names for an unknown one, and naming the fix for one
    that cannot be imported or is not a TextEnv class.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    if is_import_name(name):
        return _external(name, name)
    if name not in _INSTALLED:
        target = installed().get(name)
        if target is None:
            raise _unknown(name)
        if not is_import_name(target):
            raise ValueError(
                f"environment {name!r}: its {ENTRY_POINT_GROUP} entry point is {target!r}; "
                "it must read package.module:Class"
            )
        _INSTALLED[name] = _external(name, target)
    return _INSTALLED[name]


def _external(name: str, target: str) -> EnvSpec:
    """The entry of a TextEnv class outside ragen, imported from `target` (module:Class)."""
    cls = import_name(target, "environment")
    missing = [f"{m}()" for m in _METHODS if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        what = f"lacks {', '.join(missing)}" if isinstance(cls, type) else "is not a class"
        raise ValueError(
            f"environment {name!r}: {target} {what}: name a TextEnv class, with actions, "
            "instructions(), reset(seed), step(action) and render() (see ragen.envs.TextEnv)"
        )
    doc = inspect.getdoc(cls) or target
    return EnvSpec(name, cls, doc.splitlines()[0])


def make(name: str, **options: Any) -> TextEnv:
    """Build the environment `name` (see `spec`); `options` override its defaults."""
    entry = spec(name)
    allowed = option_names(entry.factory)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"{name} has no option {', '.join(map(repr, unknown))}; "
            f"allowed options: {', '.join(allowed)}"
        )
    env = entry.factory(**{**entry.defaults, **options})
    if not isinstance(env, TextEnv):  # only an env from outside ragen can miss a member
        raise ValueError(
            f"environment {name!r} has no actions: set self.actions in __init__ "
            "(a tuple of action words; () when the action is free text)"
        )
    return env


def option_names(factory: Callable[..., TextEnv]) -> list[str]:
    """The keyword options a factory accepts (its named parameters)."""
    params = inspect.signature(factory).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


# --------------------------------------------------------------------------- helpers


def action_lookup(actions: Iterable[str]) -> dict[str, str]:
    """Map each case-folded action word to its canonical spelling."""
    return {word.casefold(): word for word in actions}


def match_action(lookup: dict[str, str], text: str) -> str | None:
    """The canonical action for `text` (case and surrounding spaces ignored), else None."""
    return lookup.get(text.strip().casefold())


def grid_cell(cell: int, width: int) -> str:
    """A cell of a grid ``width`` wide as "row R, column C", counted from 1 at the top-left."""
    row, col = divmod(cell, width)
    return f"row {row + 1}, column {col + 1}"


def relative_position(d_row: int, d_col: int, anchor: str) -> str:
    """Where a cell lies from `anchor`, in words: (1, -2, "me") is "1 below and 2 left of me".

    d_row, d_col: the cell's row and column minus the anchor's (rows count down), not both 0.
    """
    vertical = f"{abs(d_row)} {'below' if d_row > 0 else 'above'}" if d_row else ""
    horizontal = f"{abs(d_col)} {'right' if d_col > 0 else 'left'} of" if d_col else ""
    if vertical and horizontal:
        return f"{vertical} and {horizontal} {anchor}"
    return f"{vertical or horizontal} {anchor}"


def info(success: bool, valid: bool, effective: bool, **extra: Any) -> dict[str, Any]:
    """The info dict of a step, with the three keys every env reports."""
    return {"success": success, "action_valid": valid, "action_effective": effective, **extra}


def check_int(option: str, value: Any, low: int, high: int | None = None) -> int:
    """`value` as an int in [low, high]; otherwise a ValueError naming the option."""
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, Integral)):
        raise ValueError(f"{option} must be an integer, got {value!r}")
    # int() of an Integral is exact; the numbers ABCs declare no > for a direct comparison.
    number = int(value)
    if number < low or (high is not None and number > high):
        allowed = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{option} must be {allowed}, got {value}")
    return number


def check_bool(option: str, value: Any) -> bool:
    """`value` if it is True or False (not 0, 1 or a string); otherwise a ValueError naming
    the option."""
    if not isinstance(value, bool):
        raise ValueError(f"{option} must be True or False, got {value!r}")
    return value


def check_probability(option: str, value: Any, *, allow_zero: bool = True) -> float:
    """`value` as a float in [0, 1] (or (0, 1]); otherwise a ValueError naming the option."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{option} must be a number between 0 and 1, got {value!r}")
    # numbers.Real declares only < and <=, so the lower bound is their negation; a NaN, which
    # passes it, fails `value <= 1`.
    low_ok = not value < 0 if allow_zero else not value <= 0
    if not (low_ok and value <= 1):
        allowed = "between 0 and 1" if allow_zero else "greater than 0 and at most 1"
        raise ValueError(f"{option} must be {allowed}, got {value}")
    return float(value)


class EpisodeBudget:
    """Counts actions against `max_actions` and remembers whether the episode is over.

    Every `step` call uses one unit, valid or not: an agent that keeps writing junk must
    still be stopped, and the budget is what stops it (truncated=True).
    """

    __slots__ = ("max_actions", "over", "used")

    def __init__(self, max_actions: int) -> None:
        self.max_actions = check_int("max_actions", max_actions, 1)
        self.used = 0
        self.over = True  # no episode until reset

    def start(self) -> None:
        self.used = 0
        self.over = False

    def spend(self) -> None:
        """Use one action; raises if there is no running episode."""
        if self.over:
            raise EpisodeOverError("the episode has ended (or never started): call reset(seed)")
        self.used += 1

    def close(self, terminated: bool) -> bool:
        """Mark the end if the game ended or the budget ran out; returns `truncated`."""
        truncated = not terminated and self.used >= self.max_actions
        self.over = terminated or truncated
        return truncated

    @property
    def left(self) -> int:
        return self.max_actions - self.used
