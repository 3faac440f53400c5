"""Names of a user's own code, ``package.module:attr``: a reward term, an environment class.

Such a name is judged in two steps. `is_import_name` looks at its shape only, so checking or
showing a config never runs the code it names; `import_name` imports it, which the caller
does only when a run starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def is_import_name(name: str) -> bool:
    """Whether ``name`` has the shape ``package.module:attr`` (dotted identifiers, one colon);
    nothing is imported."""
    module_name, sep, attr = name.partition(":")
    return bool(sep) and attr.isidentifier() and all(map(str.isidentifier, module_name.split(".")))


def import_name(name: str, what: str) -> object:
    """The object ``package.module:attr`` names, imported now (user code runs).

    what: what the name stands for, for the error ("reward term", "environment").
    Raises ValueError naming ``what``, the name and the fix when the module cannot be found
    or lacks the attribute. An error raised by the module's own code propagates as it is:
    its traceback points at the line to fix.
    """
    module_name, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except ModuleNotFoundError as err:
        # A console script does not put the current folder on sys.path, unlike `python -m`.
        raise ValueError(
            f"{what} {name!r} cannot be imported: {err}: install its package, or put the "
            "folder that holds it on PYTHONPATH"
        ) from None
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{what} {name!r} cannot be imported: {err}") from None


def import_function(name: str, what: str) -> Callable:
    """`import_name`, and a ValueError unless what it names can be called."""
    fn = import_name(name, what)
    if not callable(fn):
        raise ValueError(f"{what} {name!r} is {type(fn).__name__}, not a function")
    return fn
