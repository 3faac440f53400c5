"""Fixtures of the model tests: a model folder to damage, and the commands that must refuse it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragen.cli import main


@pytest.fixture
def tiny_folder(tiny, tmp_path):
    """The tiny model saved as a Hugging Face folder, as a checkpoint holds it."""
    model, tokenizer = tiny
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def refused(capsys):
    """A check that `ragen eval`, `ragen model info` and `ragen train` on a folder each exit 2
    with one line naming it and matching a message, and write nothing."""

    def check(folder: Path, message: str) -> None:
        out = folder.parent / "out"
        commands = [
            ["eval", "--env", "bandit", "--model", str(folder), "--out", str(out)],
            ["model", "info", str(folder)],
            ["train", "bandit", f"model.spec={folder}", "trainer.steps=1", "--out", str(out)],
        ]
        for argv in commands:
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert err.startswith("ragen: ") and err.count("\n") == 1, err
            assert str(folder) in err and re.search(message, err), err
            assert not out.exists()

    return check
