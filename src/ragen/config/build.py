"""Building schema dataclasses from plain data, judged as a config is: unknown keys refused
with the closest name, values checked against the field's type (and converted: an int where a
float goes, YAML's ``1e-6`` string), then against the field's range (:func:`ragen.config.opt`).
Each refusal is a ConfigError of one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from ragen.config.errors import ConfigError, shown

_T = TypeVar("_T")


def _allowed(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(str, get_args(tp)))
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return _allowed(inner[0]) + " or null"
    if origin is list:
        return f"a list of {_allowed(get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp)
    )


def _scalar_check(tp: Any) -> Any:
    """A predicate for plain scalar types (bool is not an int here: true is no count)."""
    return {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }.get(tp)


def _quoting_hint(key: str, value: Any) -> ConfigError:
    """The refusal of a non-string where a string belongs; YAML reads 2048 or yes as a number
    or a boolean, so say how to quote it."""
    echoed = shown(value)
    if not isinstance(value, int | float):  # bool is an int too
        return ConfigError(f"config: {key}={echoed} has the wrong type: must be a string")
    kind = "boolean" if isinstance(value, bool) else "number"
    return ConfigError(
        f"config: {key}={echoed} has the wrong type: must be a string, and YAML read it as a "
        f'{kind}: quote it ({key}=\'"{echoed}"\' on the command line, "{echoed}" in a file)'
    )


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against type ``tp``; return it converted (int → float, '1e-6' → float)."""
    echoed = shown(value)
    bad = ConfigError(f"config: {key}={echoed} has the wrong type: must be {_allowed(tp)}")
    origin = get_origin(tp)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"config: {key}={echoed} is not allowed: must be {_allowed(tp)}")
        return value
    if origin in (Union, types.UnionType):
        inner = next(a for a in get_args(tp) if a is not type(None))
        return None if value is None else _coerce_item(inner, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise bad
        return [_coerce_item(get_args(tp)[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad
        kind = get_args(tp)[1]
        if kind is Any:
            return dict(value)
        return {k: _coerce_item(kind, v, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        return _as_float(value, bad)
    check = _scalar_check(tp)
    if check is None:
        raise TypeError(f"config schema uses an unsupported type {tp!r} at {key}")
    if not check(value):
        raise _quoting_hint(key, value) if tp is str else bad
    return value


def _coerce_item(tp: Any, value: Any, key: str) -> Any:
    """An item of a list or mapping: a dataclass is built as a section is, else coerced."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, f"{key}.")
    return _coerce(tp, value, key)


def _as_float(value: Any, bad: ConfigError) -> float:
    # YAML 1.1 reads "1e-6" (no dot) as a string; a learning rate written so is still a number.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise bad from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad
    return float(value)


REMOVED_KEYS: dict[str, str] = {
    "trainer.scoring_pass": "the update takes its old log-probs (and, with gae or "
    "bi_level_gae, its values) from its own forward when it is exactly on-policy, and from a "
    "scoring pass before it otherwise",
    "trainer.prefix_sharing": "the update runs the opening every row shares once per "
    "mini-batch (once per micro-batch with models sharded by trainer.parallel=fsdp)",
    "trainer.sort_micro_batches": "the update cuts each mini-batch into micro-batches of rows "
    "of like length",
}
"""Keys ragen no longer has, with what it does in their place. A config or override that sets
one is refused saying so; a run directory's config.yaml written while the key existed loads
without it (:func:`drop_removed`)."""


def drop_removed(data: dict) -> dict:
    """``data`` (a whole config's nested plain data) without the ``REMOVED_KEYS`` it holds: a
    config saved by a run before they were removed."""
    out = dict(data)
    for dotted in REMOVED_KEYS:
        section, key = dotted.split(".")
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def _unknown_key(key: str, known: list[str]) -> ConfigError:
    if key in REMOVED_KEYS:
        return ConfigError(f"config: {key} was removed: {REMOVED_KEYS[key]}; drop the key")
    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, known, n=1)
    prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
    hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
    return ConfigError(
        f"config: unknown key {shown(key)}{hint}; allowed here: {', '.join(sorted(known))}"
    )


def _build(cls: type, data: Any, prefix: str) -> Any:
    # A section that is null or empty is refused, not taken as "defaults": `model:` left
    # empty in YAML would otherwise drop every setting of the preset it overrides.
    if not isinstance(data, dict):
        name = prefix.rstrip(".") or "the top level"
        raise ConfigError(f"config: {name} must be a mapping of keys, got {shown(data)}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise _unknown_key(f"{prefix}{key}", names)
    kwargs = {}
    for name in names:
        if name not in data:
            continue
        tp, key = hints[name], f"{prefix}{name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, data[name], f"{key}.")
        else:
            kwargs[name] = _coerce(tp, data[name], key)
    return cls(**kwargs)


def build_schema(cls: type[_T], data: Any, prefix: str = "") -> _T:
    """An instance of the schema dataclass ``cls`` (fields made with ``opt``) from plain
    ``data``, judged as a config is: unknown keys refused with the closest name, types and
    ranges checked; lists and mappings of dataclasses are built item by item. ``prefix``
    (``"monitor."``) is put before each key a message names. Raises ConfigError naming the
    key."""
    built = _build(cls, data, prefix)
    check_ranges(built, prefix)
    return built


def check_ranges(obj: Any, prefix: str = "") -> None:
    """Raise ConfigError unless every field of the dataclass ``obj`` (and of the dataclasses
    it holds) lies in the range its ``opt`` declares; ``prefix`` as in :func:`build_schema`."""
    ops = {
        "ge": (lambda v, b: v >= b, ">="),
        "gt": (lambda v, b: v > b, ">"),
        "le": (lambda v, b: v <= b, "<="),
        "lt": (lambda v, b: v < b, "<"),
    }
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_ranges(value, f"{key}.")
            continue
        if isinstance(value, list | dict):  # lists and mappings of dataclasses
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for at, item in items:
                if dataclasses.is_dataclass(item):
                    inner = f"{key}[{at}]." if isinstance(value, list) else f"{key}.{at}."
                    check_ranges(item, inner)
            continue
        if value is None:
            continue
        for op, bound in f.metadata.items():
            if not ops[op][0](value, bound):
                rule = " and ".join(f"{ops[o][1]} {b}" for o, b in f.metadata.items())
                raise ConfigError(f"config: {key}={shown(value)} is out of range: must be {rule}")
