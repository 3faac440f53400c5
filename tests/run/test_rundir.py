"""The run directory: its layout, a reloadable config, no overwrite, and its default name."""

import pytest

from ragen import config
from ragen.run.jsonl import RunDirError
from ragen.run.rundir import create_run_dir, default_run_root


def test_run_dir_layout_and_reloadable_config(tmp_path):
    c = config.load("sokoban-rl", ["algo.clip_high=0.3"])
    run = create_run_dir(tmp_path / "run", c)
    assert run.config.is_file() and run.trajectories.is_dir() and run.checkpoints.is_dir()
    assert config.load(str(run.config)) == c
    assert run.trajectory_file(3).name == "step_000003.jsonl"
    assert run.checkpoint(50).name == "step_000050"


def test_existing_run_dir_is_never_overwritten(tmp_path):
    c = config.load("bandit")
    create_run_dir(tmp_path / "run", c)
    with pytest.raises(RunDirError, match="--resume"):
        create_run_dir(tmp_path / "run", c)
    (tmp_path / "empty").mkdir()
    create_run_dir(tmp_path / "empty", c)  # an empty folder is fine


def test_default_run_root_names_the_preset():
    from datetime import UTC, datetime

    when = datetime(2026, 11, 21, 6, 5, 4, tzinfo=UTC)
    assert str(default_run_root("bandit", when)) == "runs/bandit-20261121-060504"
    assert str(default_run_root("configs/my.yaml", when)) == "runs/my-20261121-060504"
    # a user env's import name: no colon or dots in the folder name
    assert str(default_run_root("eval-mypkg.mazes:Maze", when)) == (
        "runs/eval-mypkg-mazes-Maze-20261121-060504"
    )
