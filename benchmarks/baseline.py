"""A benchmark's baseline: the same measurement run against another commit's ragen.

    python -m benchmarks.step --baseline COMMIT [--baseline-set KEY=VALUE ...]

A benchmark that compares two sides measures each in a fresh Python process (:func:`call`)
that imports ``ragen`` from a given ``src`` folder and the measuring code (``benchmarks``) from
this checkout, so both sides are measured by the same code. ``--baseline COMMIT`` checks
COMMIT out into a temporary git worktree (:func:`checkout`) whose ``src`` the baseline side
imports; ``--baseline-set`` adds overrides to the baseline side only (with no ``--baseline``,
both sides run this checkout: two settings compared). The baseline commit must offer what
the measurement calls (``Trainer.step`` and the rest), so older paths keep the figures the
committed results hold (docs/performance.md names the commit of each). Each side reads the
preset by name from its own ``src``: a commit from before ``sokoban-rl`` (2026-11-29, what
``sokoban`` was until then) takes it as a file, ``--preset src/ragen/configs/sokoban-rl.yaml``.

A measuring process runs ``python -m benchmarks.baseline TARGET ARGS OUT``: it calls
``TARGET`` (``package.module:function``) with the JSON list ``ARGS`` and writes
``{"result": ..., "ragen": FOLDER}`` to the file ``OUT``, FOLDER being where it imported
ragen from, which :func:`call` checks.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ragen

ROOT = Path(__file__).resolve().parents[1]
"""This checkout: its ``benchmarks`` measure both sides."""
SRC = ROOT / "src"
"""This checkout's ragen, the current side."""


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise SystemExit(f"git {' '.join(args)} failed: {lines[-1]}")
    return done.stdout.strip()


def resolve(commit: str) -> str:
    """The full hash of ``commit`` (a hash, branch, tag or ``HEAD~1``) in this repository."""
    try:
        return _git("rev-parse", "--verify", f"{commit}^{{commit}}")
    except SystemExit:
        raise SystemExit(f"--baseline {commit}: no such commit in {ROOT}") from None


@contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """A git worktree of ``commit`` (detached) in a temporary folder, removed on exit."""
    full = resolve(commit)
    folder = Path(tempfile.mkdtemp(prefix="ragen-baseline-"))
    tree = folder / "tree"
    try:
        _git("worktree", "add", "--detach", "--quiet", str(tree), full)
    except SystemExit:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)


def call(src: Path, target: str, *args: Any) -> Any:
    """``target(*args)`` (``package.module:function``; JSON arguments and result) run in a
    fresh Python process that imports ragen from ``src``. Raises RuntimeError when that
    process fails, or imported ragen from elsewhere (an installed copy shadowing ``src``)."""
    with tempfile.TemporaryDirectory(prefix="ragen-measure-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.baseline", target, json.dumps(args), str(out)]
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(src)})
        if done.returncode != 0:
            raise RuntimeError(f"{target} at {src} exited with {done.returncode}")
        answer = json.loads(out.read_text())
    imported = Path(answer["ragen"])
    if imported != (src / "ragen").resolve():
        raise RuntimeError(f"the measuring process imported ragen from {imported}, not {src}")
    return answer["result"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--baseline COMMIT`` and ``--baseline-set KEY=VALUE`` (see the module's docstring)."""
    parser.add_argument(
        "--baseline",
        metavar="COMMIT",
        help="also measure COMMIT's ragen, checked out into a temporary git worktree",
    )
    parser.add_argument(
        "--baseline-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override for the baseline side only, after --set",
    )


def command_words(args: argparse.Namespace) -> list[str]:
    """The ``--baseline`` and ``--baseline-set`` words of the command that ran."""
    words = [f"--baseline {args.baseline}"] if args.baseline else []
    return words + [f"--baseline-set {s}" for s in args.baseline_set]


@contextmanager
def sides(args: argparse.Namespace) -> Iterator[dict[str, tuple[Path, list[str]]]]:
    """Each side to measure, by name: (the ragen ``src`` it imports, its overrides). current:
    this checkout with ``args.set``; baseline, when ``--baseline`` or ``--baseline-set`` is
    given: a worktree of ``--baseline`` (else this checkout) with ``--set`` then
    ``--baseline-set``. The worktree is removed on exit."""
    current = (SRC, list(args.set))
    if not args.baseline and not args.baseline_set:
        yield {"current": current}
        return
    baseline = [*args.set, *args.baseline_set]
    if not args.baseline:
        yield {"baseline": (SRC, baseline), "current": current}
        return
    with checkout(args.baseline) as tree:
        yield {"baseline": (tree / "src", baseline), "current": current}


def main() -> None:
    target, arguments, out = sys.argv[1:4]
    module, _, name = target.partition(":")
    result = getattr(importlib.import_module(module), name)(*json.loads(arguments))
    where = str(Path(ragen.__file__).resolve().parent)
    Path(out).write_text(json.dumps({"result": result, "ragen": where}))


if __name__ == "__main__":
    main()
