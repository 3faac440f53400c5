"""Environments from outside ragen: `package.module:Class` names and `ragen.envs` entry points,
through envs.make, a config, and the command line (`envs --check`, `play`, `eval`), with the
maze of docs/examples as the user's env."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ragen import config, envs
from ragen.cli import main
from ragen.config import ConfigError
from ragen.envs.conformance import check
from ragen.envs.play import describe_envs
from ragen.train import preflight

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
MAZE = "maze:MazeEnv"


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _module(folder: Path, monkeypatch, name: str, text: str) -> None:
    """Write module ``name`` into ``folder`` and make it importable, fresh."""
    (folder / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)


def _marker_module(folder: Path, monkeypatch) -> Path:
    """A module whose import leaves a file behind (proof that user code ran), offering the
    maze as ``ragen_marker_env:MazeEnv``."""
    marker = folder / "imported"
    text = f"open({str(marker)!r}, 'w').close()\nfrom maze import MazeEnv\n"
    _module(folder, monkeypatch, "ragen_marker_env", text)
    return marker


# ------------------------------------------------------------------------- envs.make


def test_make_builds_a_class_named_by_module_and_class():
    from maze import MazeEnv

    env = envs.make(MAZE)
    assert isinstance(env, MazeEnv) and isinstance(env, envs.TextEnv)
    assert (
        envs.spec(MAZE).description == "Walk through a seeded grid maze to the goal (multi-turn)."
    )
    assert envs.make(MAZE, rooms=4).reset(0).count("\n") == 8  # 9 rows: options reach the class
    with pytest.raises(ValueError, match="has no option 'size'; allowed options: rooms"):
        envs.make(MAZE, size=4)
    envs.check_name(MAZE)  # a valid name: no error, and nothing registered
    assert MAZE not in envs.names()


def test_the_maze_conforms_and_every_level_is_solved_by_its_solution():
    from maze import generate

    assert check(MAZE) == []
    for seed in range(30):
        env = envs.make(MAZE)
        env.reset(seed)
        results = [env.step(word) for word in generate(seed).solution]
        assert results[-1].info["success"] and results[-1].terminated
        assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("ragen_no_such_module:Env", "No module named 'ragen_no_such_module'.*PYTHONPATH"),
        ("maze:NoSuchEnv", "has no attribute 'NoSuchEnv'"),
        ("maze:generate", "maze:generate is not a class: name a TextEnv class"),
        ("maze:Maze", r"lacks instructions\(\), reset\(\), step\(\), render\(\)"),
        ("chess", "unknown environment 'chess'; allowed names: bandit.*package.module:Class"),
    ],
)
def test_a_name_that_names_no_env_class_is_refused_with_the_fix(name, message):
    with pytest.raises(ValueError, match=message):
        envs.make(name)


NO_ACTIONS = """
class NoActions:
    def instructions(self):
        return "Say anything."

    def reset(self, seed):
        return ""

    def step(self, action):
        raise NotImplementedError

    def render(self):
        return ""
"""


def test_a_class_without_actions_is_refused_when_built(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "ragen_no_actions_env", NO_ACTIONS)
    with pytest.raises(ValueError, match=r"has no actions: set self\.actions in __init__"):
        envs.make("ragen_no_actions_env:NoActions")


# ----------------------------------------------------------------------------- config


def test_a_config_names_a_user_env_without_importing_it(tmp_path, monkeypatch, capsys):
    marker = _marker_module(tmp_path, monkeypatch)
    name = "env.name=ragen_marker_env:MazeEnv"
    assert main(["config", "show", "bandit", name]) == 0
    assert "name: ragen_marker_env:MazeEnv" in capsys.readouterr().out
    c = config.load("bandit", [name, "env.eval_names=[ragen_marker_env:MazeEnv, bandit]"])
    assert not marker.exists()
    preflight.import_envs(c)  # when the run starts; the maze offers the 2 worked turns asked for
    assert marker.exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.name=ragen_no_such_module:Env"], "env.name='ragen_no_such_module:Env':.*PYTHONPATH"),
        (["env.eval_names=[maze:Maze]"], r"env.eval_names\[0\]='maze:Maze':.*lacks"),
        ([f"env.name={MAZE}", "env.options={rooms: 1}"], "env.options=.*rooms must be between"),
        (
            [f"env.name={MAZE}", "env.eval_names=[]", "rollout.demos=3"],
            "maze:MazeEnv offers 2 demonstrations",
        ),
    ],
)
def test_a_user_env_that_cannot_run_is_refused_when_the_run_starts(overrides, message):
    c = config.load("bandit", overrides)  # only the names' shape is judged here
    with pytest.raises(ConfigError, match=message):
        preflight.import_envs(c)


def test_a_name_of_no_env_shape_is_refused_by_the_config():
    message = r"env.name='my-envs:Maze': unknown environment .*package.module:Class"
    with pytest.raises(ConfigError, match=message):
        preflight.check_references(config.load("bandit", ["env.name=my-envs:Maze"]))  # no hyphen


# ----------------------------------------------------------------------- entry points


def _install(folder: Path, monkeypatch, entry_points: str) -> None:
    """An installed distribution, as pip leaves one: a dist-info folder on sys.path whose
    entry_points.txt importlib.metadata reads."""
    info = folder / "ragen_maze_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ragen-maze-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{envs.ENTRY_POINT_GROUP}]\n{entry_points}")
    monkeypatch.syspath_prepend(str(folder))


def test_an_installed_entry_point_names_an_env(tmp_path, monkeypatch, capsys):
    _install(tmp_path, monkeypatch, "maze-plugin = maze:MazeEnv\n")
    assert envs.installed() == {"maze-plugin": MAZE}
    assert describe_envs().splitlines()[-1].split() == [
        "maze-plugin",
        MAZE,
        "(a",
        "ragen.envs",
        "entry",
        "point)",
    ]
    assert envs.make("maze-plugin").reset(3) == envs.make(MAZE).reset(3)
    assert config.load("bandit", ["env.name=maze-plugin"]).env.name == "maze-plugin"
    assert main(["envs", "--check", "maze-plugin"]) == 0
    assert "maze-plugin: conforms" in capsys.readouterr().out


def test_an_entry_point_of_no_class_shape_is_refused(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "maze-bad-plugin = maze.MazeEnv\n")
    with pytest.raises(ValueError, match=r"entry point is 'maze\.MazeEnv'; it must read"):
        envs.make("maze-bad-plugin")


# ---------------------------------------------------------------------- command line


BROKEN = """
from maze import MazeEnv


class Broken(MazeEnv):
    def instructions(self):
        return "Walk."  # names no action word

    def step(self, action):
        if action == "Left":
            raise RuntimeError("a bug in step")
        return super().step(action)
"""


def test_envs_check_passes_a_good_env_and_fails_a_broken_one(tmp_path, monkeypatch, capsys):
    assert main(["envs", "--check", MAZE]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["ok"] * 5 + [f"{MAZE}:"]
    assert lines[-1] == f"{MAZE}: conforms"
    _module(tmp_path, monkeypatch, "ragen_broken_env", BROKEN)
    assert main(["envs", "--check", "ragen_broken_env:Broken"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  actions, instructions()" in out
    assert "instructions() must list every action word" in out
    assert "raised RuntimeError: a bug in step" in out
    assert "ragen_broken_env:Broken: 3 of 5 parts fail" in out  # resets and junk words hold
    assert main(["envs", "--check", "ragen_no_such_module:Env"]) == 2
    assert "cannot be imported" in capsys.readouterr().err


def test_play_a_user_env(capsys):
    from maze import generate

    words = ",".join(generate(0).solution)
    assert main(["play", MAZE, "--seed", "0", "--actions", words]) == 0
    assert "episode over (the game ended): success" in capsys.readouterr().out


def test_eval_a_user_env_without_a_preset(tiny, tmp_path, capsys):
    out = tmp_path / "ev"
    args = ["eval", "--env", MAZE, "--model", "tiny", "--n", "2", "--out", str(out)]
    assert main([*args, "rollout.max_reply_tokens=6"]) == 0
    assert "maze:MazeEnv: success 0.00%" in capsys.readouterr().out
    summary = json.loads((out / "eval.jsonl").read_text())
    assert (summary["env"], summary["episodes"]) == (MAZE, 2)
