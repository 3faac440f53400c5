"""ragen's layers, read from the code: every import between ragen's packages must point down.

Each top-level package (or root module) of ``src/ragen`` has a layer in `LAYERS` (``ragen``
is the root ``__init__``, which holds the version); a module may
import from its own package or from a lower layer, never from its own layer's neighbours or
from above, and `FORBIDDEN` names the pairs the layering alone would allow but the design
does not (environments know nothing of models, the estimators nothing of environments).
Function-local imports count like top-level ones: a lazy import is still a dependency.

docs/ARCHITECTURE.md embeds the graph this file draws; ``python tests/test_architecture.py``
rewrites that block after a deliberate change, and the test fails while the two differ.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ragen"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN = "<!-- import graph: begin (python tests/test_architecture.py rewrites it) -->"
END = "<!-- import graph: end -->"

# Lowest first. A unit is a package under src/ragen or a module at its root.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("ragen", "host", "metric_names", "phases", "user_code"),
    ("config",),
    ("agent", "models"),
    ("envs",),
    ("algos", "rollout", "run"),
    ("monitor",),
    ("train", "report"),
    ("study", "viewer"),
    ("cli",),
    ("__main__",),
)
FORBIDDEN = {("envs", "models"), ("algos", "envs"), ("algos", "rollout"), ("viewer", "train")}
LAYER = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    """``src/ragen/train/update.py`` -> ``ragen.train.update`` (a package's ``__init__``
    names the package)."""
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> Iterator[str]:
    """Every ragen module or name the file imports, absolute, anywhere in the file."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("ragen"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "ragen":  # `from ragen import phases`: a module, or the root's name
                for alias in node.names:
                    named = SRC / alias.name
                    is_module = named.is_dir() or named.with_suffix(".py").is_file()
                    yield f"ragen.{alias.name}" if is_module else "ragen"
            elif target.startswith("ragen."):
                yield target


def unit(module: str) -> str:
    """The layer unit a module belongs to: ``ragen.train.update`` -> ``train``; the package's
    own ``__init__`` (``ragen``) is the root, which only names the version."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ragen"


def edges() -> dict[tuple[str, str], int]:
    """(importer unit, imported unit) -> number of import statements, across units only."""
    counts: dict[tuple[str, str], int] = {}
    for path in sorted(SRC.rglob("*.py")):
        source = unit(module_name(path))
        for target in imported(path):
            pair = (source, unit(target))
            if pair[0] != pair[1]:
                counts[pair] = counts.get(pair, 0) + 1
    return counts


def violations(graph: dict[tuple[str, str], int]) -> list[str]:
    """One line per import that breaks the layering."""
    found = []
    for source, target in sorted(graph):
        if source not in LAYER or target not in LAYER:
            missing = source if source not in LAYER else target
            found.append(f"{missing}: not in LAYERS (give it a layer)")
        elif LAYER[target] >= LAYER[source]:
            found.append(f"{source} imports {target}: layer {LAYER[target]} >= {LAYER[source]}")
        elif (source, target) in FORBIDDEN:
            found.append(f"{source} imports {target}: forbidden by design")
    return found


def mermaid(graph: dict[tuple[str, str], int]) -> str:
    """The graph as a mermaid flowchart: one box per layer, from the top (the entry points)
    down, and an arrow for every pair of units with an import between them."""

    def node(unit: str) -> str:
        return unit.strip("_")

    lines = ["```mermaid", "flowchart TD"]
    for rank in reversed(range(len(LAYERS))):
        lines.append(f'    subgraph layer{rank}["layer {rank}"]')
        lines += [f'        {node(u)}["{u}"]' for u in LAYERS[rank]]
        lines.append("    end")
    lines += [f"    {node(source)} --> {node(target)}" for source, target in sorted(graph)]
    lines.append("```")
    return "\n".join(lines)


def embedded(text: str) -> str:
    """The block between the markers of docs/ARCHITECTURE.md."""
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:stop].strip()


def test_imports_point_down() -> None:
    assert violations(edges()) == []


def test_architecture_page_shows_todays_graph() -> None:
    assert embedded(DOC.read_text(encoding="utf-8")) == mermaid(edges())


def test_an_upward_or_forbidden_import_is_named() -> None:
    graph = {("config", "train"): 1, ("envs", "models"): 2, ("train", "config"): 5}
    assert violations(graph) == [
        "config imports train: layer 6 >= 1",
        "envs imports models: forbidden by design",
    ]
    assert violations({("ragen_x", "config"): 1}) == ["ragen_x: not in LAYERS (give it a layer)"]


if __name__ == "__main__":
    text = DOC.read_text(encoding="utf-8")
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + mermaid(edges()) + "\n" + text[stop:], encoding="utf-8")
    sys.exit(1 if violations(edges()) else 0)
