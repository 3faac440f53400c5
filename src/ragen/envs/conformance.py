"""The conformance checker: what every registered environment must do, checked by running it.

`check(name)` returns a list of problems (empty when the env conforms); `check_parts(name)`
the problems of each part of the contract, which `ragen envs --check NAME` prints;
`check_all()` runs `check` over every registered name. The tests call it for each name, so a
new environment is held to the contract the moment it is registered:

- same seed → same text (fresh instances and re-resets alike), and the same trajectory for
  the same actions, stochastic games included;
- different seeds → different levels (at least two distinct among the seeds tried);
- observations are `str` and equal `render()`; rewards are finite floats; terminated and
  truncated are bools; info has `success`, `action_valid`, `action_effective` as bools;
- an invalid word is a no-op: action_valid and action_effective False, reward 0, same text;
- action words match case-insensitively and ignore surrounding spaces;
- every episode ends (the step budget truncates it), and stepping before `reset` or after
  the end raises EpisodeOverError.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ragen.envs.base import (
    INFO_KEYS,
    EpisodeOverError,
    StepResult,
    TextEnv,
    demo_count,
    demonstrations,
    make,
    names,
    spec,
)

INVALID_WORD = "not-an-action-zzz"
# Answers tried on free-text envs (empty `actions`): one that parses, one that does not.
FREE_TEXT_PROBES = ("1 + 2", "(3 * 4) - 5")
MAX_EPISODE_STEPS = 10_000

Factory = Callable[[], TextEnv]


def _probes(env: TextEnv) -> tuple[str, ...]:
    return tuple(env.actions) or FREE_TEXT_PROBES


def _play(env: TextEnv, seed: int, actions: Iterable[str]) -> list[StepResult]:
    """Reset on `seed` and take `actions` until the episode ends."""
    env.reset(seed)
    results = []
    for action in actions:
        results.append(env.step(action))
        if results[-1].done:
            break
    return results


def _random_actions(env: TextEnv, seed: int, count: int) -> list[str]:
    choices = [*_probes(env), INVALID_WORD]
    picks = np.random.default_rng(seed).integers(len(choices), size=count)
    return [choices[k] for k in picks.tolist()]


def _result_problems(result: Any, env: TextEnv) -> list[str]:
    """Type problems of one step's result."""
    if not isinstance(result, StepResult):
        return [f"step returned {type(result).__name__}, not StepResult"]
    problems = []
    if not isinstance(result.observation, str):
        problems.append(f"observation is {type(result.observation).__name__}, not str")
    elif result.observation != env.render():
        problems.append("observation differs from render() after the step")
    if not isinstance(result.reward, float) or not math.isfinite(result.reward):
        problems.append(f"reward {result.reward!r} is not a finite float")
    if not isinstance(result.terminated, bool) or not isinstance(result.truncated, bool):
        problems.append("terminated and truncated must be bool")
    missing = [key for key in INFO_KEYS if not isinstance(result.info.get(key), bool)]
    if missing:
        problems.append(f"info lacks bool {', '.join(missing)}")
    return problems


def _check_surface(factory: Factory) -> list[str]:
    env = factory()
    problems = []
    if not isinstance(env.actions, tuple) or not all(isinstance(a, str) for a in env.actions):
        problems.append("actions must be a tuple of str")
    text = env.instructions()
    if not isinstance(text, str) or not text.strip():
        problems.append("instructions() must be non-empty text")
    elif any(a.casefold() not in text.casefold() for a in env.actions):
        problems.append("instructions() must list every action word")
    try:
        env.step(_probes(env)[0])
        problems.append("step before reset must raise EpisodeOverError")
    except EpisodeOverError:
        pass
    offered = len(demonstrations(env))  # the config counts them by demo_count, unbuilt
    if demo_count(env) != offered:
        problems.append(f"demo_count is {demo_count(env)} but demonstrations() gave {offered}")
    return problems


def _check_seeds(factory: Factory, seeds: Sequence[int]) -> list[str]:
    first, second = factory(), factory()
    problems = []
    texts = []
    for seed in seeds:
        text = first.reset(seed)
        if not isinstance(text, str):
            return [f"reset({seed}) returned {type(text).__name__}, not str"]
        if text != first.render():
            problems.append(f"reset({seed}) text differs from render()")
        if text != second.reset(seed) or text != first.reset(seed):
            problems.append(f"reset({seed}) is not deterministic")
        texts.append(text)
    if len(seeds) > 1 and len(set(texts)) < 2:
        problems.append(f"seeds {list(seeds)} all gave the same level")
    return problems


def _check_episode(factory: Factory, seed: int) -> list[str]:
    """A long random episode: types on every step, an end within the budget, a closed end."""
    env = factory()
    actions = _random_actions(env, seed, MAX_EPISODE_STEPS)
    env.reset(seed)
    problems: list[str] = []
    for action in actions:
        result = env.step(action)
        problems += _result_problems(result, env)
        if problems or result.done:
            break
    else:
        return [f"no end after {MAX_EPISODE_STEPS} steps: is max_actions enforced?"]
    try:
        env.step(_probes(env)[0])
        problems.append("step after the end must raise EpisodeOverError")
    except EpisodeOverError:
        pass
    return problems


def _check_invalid_word(factory: Factory, seed: int) -> list[str]:
    env = factory()
    before = env.reset(seed)
    result = env.step(INVALID_WORD)
    problems = _result_problems(result, env)
    if problems:
        return problems
    if result.info["action_valid"] or result.info["action_effective"]:
        problems.append("an invalid word must give action_valid=False, action_effective=False")
    if result.reward != 0.0 or result.terminated or result.observation != before:
        problems.append("an invalid word must be a no-op: reward 0, not terminated, same text")
    return problems


def _check_replay(factory: Factory, seed: int) -> list[str]:
    """Same seed and actions → same trajectory; other case and spaces → same trajectory."""
    env = factory()
    actions = [a for a in _random_actions(env, seed + 1, 50) if a != INVALID_WORD]
    reference = _play(env, seed, actions)
    if _play(factory(), seed, actions) != reference:
        return [f"seed {seed}: the same actions gave a different trajectory"]
    if env.actions and _play(factory(), seed, [f" {a.swapcase()} " for a in actions]) != reference:
        return [f"seed {seed}: action words must match case-insensitively"]
    return []


_EPISODE_SEEDS = 3  # seeds the per-seed parts play (an episode may run 10,000 steps)
Part = Callable[[Factory, Sequence[int]], list[str]]


def _each_seed(check_one: Callable[[Factory, int], list[str]]) -> Part:
    """A part that runs ``check_one`` on each of the first seeds."""

    def part(factory: Factory, seeds: Sequence[int]) -> list[str]:
        return [p for seed in seeds[:_EPISODE_SEEDS] for p in check_one(factory, seed)]

    return part


# The parts of the contract, in the order `check_parts` runs them: what each holds, and how.
_PARTS: tuple[tuple[str, Part], ...] = (
    (
        "actions, instructions(), demo_count; step before reset raises",
        lambda f, _: _check_surface(f),
    ),
    ("reset(seed) is deterministic, equals render(), and seeds differ", _check_seeds),
    ("random episodes: result types, an end, no step after it", _each_seed(_check_episode)),
    ("an invalid word is a no-op", _each_seed(_check_invalid_word)),
    ("same seed and actions, same trajectory, in any case", _each_seed(_check_replay)),
)


def check_parts(
    env: str | Factory, seeds: Sequence[int] = tuple(range(6)), **options: Any
) -> dict[str, list[str]]:
    """Each part of the contract and the problems found with it (none: the part holds).

    env: an environment name as `make` takes it (built with `options`) or a zero-argument
        factory, so an env can be checked before it is registered.
    An unknown name, or one that cannot be imported, raises ValueError. An exception raised
    while a part runs is that part's problem, and the other parts still run: the checker
    reports on a half-written env instead of stopping at its first bug.
    """
    if isinstance(env, str):
        name = env
        spec(name)  # an unknown name, or one that cannot be imported, raises its ValueError

        def factory() -> TextEnv:
            return make(name, **options)
    else:
        name, factory = getattr(env, "__name__", repr(env)), env

    parts = {}
    for part, run in _PARTS:
        try:
            problems = run(factory, seeds)
        except Exception as err:  # the env's own bug: reported, as a failure of this part
            problems = [f"raised {type(err).__name__}: {err}"]
        parts[part] = [f"{name}: {problem}" for problem in dict.fromkeys(problems)]
    return parts


def check(env: str | Factory, seeds: Sequence[int] = tuple(range(6)), **options: Any) -> list[str]:
    """Problems of an environment; an empty list means it conforms (see `check_parts`)."""
    parts = check_parts(env, seeds, **options)
    return list(dict.fromkeys(problem for problems in parts.values() for problem in problems))


def check_all(seeds: Sequence[int] = tuple(range(6))) -> dict[str, list[str]]:
    """`check` over every registered name."""
    return {name: check(name, seeds) for name in names()}
