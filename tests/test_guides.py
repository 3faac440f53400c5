"""The guides in docs/guides/ cannot rot: every ```python block of a guide runs, in order, in
one namespace per guide, from a fresh working folder, with docs/examples/ importable (so a
guide may show `env.name=maze:MazeEnv` and mean it). A block fenced otherwise (```console,
```yaml, ```text) is shown, not run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
GUIDES = sorted((DOCS / "guides").glob("*.md"))
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """The code of each ```python fence of a Markdown text, in order."""
    return _BLOCK.findall(text)


def test_blocks_are_found_in_order():
    text = "intro\n```python\na = 1\n```\n```console\n$ ragen envs\n```\n```python\nb = a\n```\n"
    assert python_blocks(text) == ["a = 1\n", "b = a\n"]


# The scaling-out guide launches torchrun (two processes, each importing torch and
# transformers): the launches test_distributed makes prove what it shows, so it runs with -m slow.
SLOW = {"scaling-out"}


@pytest.mark.parametrize(
    "guide",
    [pytest.param(g, id=g.stem, marks=pytest.mark.slow if g.stem in SLOW else ()) for g in GUIDES],
)
def test_guide_code_runs(guide: Path, tmp_path, monkeypatch):
    blocks = python_blocks(guide.read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(DOCS / "examples"))
    namespace: dict = {"__name__": f"guide_{guide.stem.replace('-', '_')}"}
    for number, code in enumerate(blocks, 1):
        try:
            exec(compile(code, f"{guide.name} block {number}", "exec"), namespace)
        except Exception as err:  # name the block, so the guide is easy to fix
            raise AssertionError(f"{guide.name}, python block {number} failed: {err!r}") from err
    # Examples imported by a guide are fresh for the next one (each guide stands alone).
    for name in [m for m, mod in list(sys.modules.items()) if _from_examples(mod)]:
        del sys.modules[name]


def _from_examples(module) -> bool:
    file = getattr(module, "__file__", None) or ""
    return file.startswith(str(DOCS / "examples"))
