"""Reward terms: a turn's reward is a sum of named terms, each logged on its own.

Two terms are always there: ``env`` (the game's rewards for the actions the reply ran) and
``format`` (``rollout.format_penalty`` when the reply ran no action, or with
``rollout.format_penalty_mode=any_invalid`` also when any answer piece was not an action).
Shaping terms are plain functions of the finished turn, listed in the config with a weight::

    rollout:
      reward_terms: {think_bonus: 0.05}                 # a built-in, by name
      reward_terms: {mypkg.shaping:short_think: -0.01}  # any importable function

A term ``f(turn) -> float`` sees the `Turn` (reply, think, answer, actions, rewards,
format_ok, think_tokens, ...) and adds ``weight * f(turn)`` to the turn's reward; the trainer
logs its mean per episode as ``reward/<name>``. Terms act on what the reply did, never on the
token ids, so a term cannot reach into the update.

A ``module:function`` term is user code, imported only when a run starts (`resolve`), from
the config the user passed (a preset file, an override, or the config.yaml of the run they
resume). Checking or showing a config imports nothing: `check_name` judges only the shape of
the name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ragen.rollout.trajectory import Turn
from ragen.user_code import import_function, is_import_name

TermFn = Callable[[Turn], float]
ALWAYS = ("env", "format")


def think_bonus(turn: Turn) -> float:
    """1 when the reply reasoned (a non-empty think), else 0: rewards thinking at all."""
    return 1.0 if turn.think.strip() else 0.0


def think_tokens(turn: Turn) -> float:
    """The think length in tokens: with a small negative weight, a cost on long thinking."""
    return float(turn.think_tokens)


def answered_think_tokens(turn: Turn) -> float:
    """The think length in tokens of a reply that ran an action and was not cut
    (``format_ok``), else 0: a reward for thinking that a reply cannot earn by never closing
    its thought, which a positive ``think_tokens`` pays for (docs/findings.md)."""
    return float(turn.think_tokens) if turn.format_ok else 0.0


BUILTIN: dict[str, TermFn] = {
    "think_bonus": think_bonus,
    "think_tokens": think_tokens,
    "answered_think_tokens": answered_think_tokens,
}


def check_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a built-in or has the shape ``package.module:function``
    (dotted identifiers); nothing is imported, so checking a config never runs its code."""
    if name in BUILTIN:
        return
    if name in ALWAYS:
        raise ValueError(f"{name!r} is always part of the reward; it is not a shaping term")
    if not is_import_name(name):
        allowed = ", ".join(BUILTIN)
        raise ValueError(f"unknown reward term {name!r}: use one of {allowed}, or module:function")


def resolve(name: str) -> TermFn:
    """The function a config name stands for: a built-in, or ``package.module:function``,
    which is imported here (user code: call this only when a run starts).

    Raises ValueError saying what is allowed when the name names nothing callable.
    """
    check_name(name)
    if name in BUILTIN:
        return BUILTIN[name]
    return import_function(name, "reward term")


def shaping(turn: Turn, terms: Mapping[str, tuple[TermFn, float]]) -> dict[str, float]:
    """Each term's weighted value for ``turn``; a term returning a non-number or a
    non-finite value is a ValueError naming it (a silent NaN would poison the update)."""
    values = {}
    for name, (fn, weight) in terms.items():
        raw = fn(turn)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            raise ValueError(f"reward term {name!r} returned {raw!r}, not a finite number")
        values[name] = weight * float(raw)
    return values
