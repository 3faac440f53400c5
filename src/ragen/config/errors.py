"""ConfigError, and how its one-line messages quote a value or another module's error."""

from __future__ import annotations

import reprlib
from typing import Any

SHOWN_CHARS = 80  # of a value echoed in an error: the message never grows with the input
MESSAGE_CHARS = 300  # of another module's error text quoted in a ConfigError


class ConfigError(ValueError):
    """A configuration the run must not start with; ``str(err)`` is one actionable line."""


def short(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters, marked with ... where cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, SHOWN_CHARS, SHOWN_CHARS


def reason(err: Exception) -> str:
    """Another module's error text, cut short, to quote in a ConfigError."""
    return short(str(err), MESSAGE_CHARS)


def shown(value: Any) -> str:
    """A value as an error message echoes it: YAML's null/true/false, else a repr cut short
    (built from the first items only, so a huge or deeply shared value costs nothing)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    try:
        return short(_REPR.repr(value))
    except ValueError:  # an int too long to print (Python refuses beyond 4300 digits)
        return f"<a {type(value).__name__} too long to show>"
