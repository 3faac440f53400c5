"""Fixtures of the viewer tests: a real run of the tiny model, and copies with planted lines.

The main fixture is a genuine run directory written by the trainer (3 steps of Sokoban with
the tiny model). Safety and filter tests use a copy to which hostile and broken lines are
appended, exactly as a model's reply or a killed run would leave them.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from ragen import config
from ragen.run.jsonl import read_jsonl, to_json_line
from ragen.run.rundir import RunDir, create_run_dir

STEPS = 3
TINY = [
    "model.spec=tiny",
    "rollout.groups=4",
    "rollout.group_size=2",
    "rollout.max_reply_tokens=8",
    "algo.estimator=grpo",  # no critic to train
    "algo.filter_ratio=0.25",  # the update sees one group: the run is real but cheap
    "trainer.mini_batch_size=2",
    "trainer.micro_batch_size=2",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.gradient_analysis_every=2",  # steps 0 and 2: the page shows step 2's
    f"trainer.steps={STEPS}",
    "logging.progress=false",
    "logging.tensorboard=false",
]

# Every way a reply could try to run code in the page; each would set window.__pwned or
# log "pwned" if the page ever parsed model text as HTML.
PAYLOAD_REPLY = (
    "<think><script>window.__pwned=1;console.log('pwned')</script>"
    '<a href="javascript:window.__pwned=2">click me</a></think>'
    "<answer><img src=x onerror=\"window.__pwned=3;console.log('pwned')\"></answer>"
)
PAYLOAD_ENV = "<img src=x onerror=\"window.__pwned=4;console.log('pwned')\">"
PLANTED_ALERT = {
    "step": 1,
    "kind": "collapse",
    "signal": "rollout/reward_std",
    "value": 0.0,
    "baseline": 0.2,
    "message": "in-group reward std fell to 0.000 from its peak 0.200",
}


@dataclass(frozen=True)
class Planted:
    """What the fixtures planted, for the tests to look for (test modules cannot import
    conftest under --import-mode=importlib, so it travels as a fixture)."""

    steps: int = STEPS
    reply: str = PAYLOAD_REPLY
    env: str = PAYLOAD_ENV
    alert: dict | None = None


@pytest.fixture(scope="session")
def planted() -> Planted:
    return Planted(alert=PLANTED_ALERT)


@pytest.fixture(scope="session")
def copy_run():
    """copy_run(source, target): a copy of a run directory to append to."""

    def _copy(source: Path, target: Path) -> Path:
        shutil.copytree(source, target)
        return target

    return _copy


@pytest.fixture(scope="session")
def viewer_run(tmp_path_factory) -> Path:
    """A run directory written by `Trainer` for the tiny model (no fakes)."""
    from ragen.train.loop import RunLoop
    from ragen.train.trainer import Trainer

    cfg = config.load("sokoban-rl", TINY)
    root = tmp_path_factory.mktemp("viewer") / "tiny-run"
    create_run_dir(root, cfg)
    RunLoop(Trainer(cfg), RunDir(root)).train()
    shutil.rmtree(root / "checkpoints")  # the viewer never reads them
    return root


def planted_episode(run: Path) -> dict:
    """A real episode of the last step, rewritten to carry hostile text everywhere."""
    base = read_jsonl(RunDir(run).trajectory_file(STEPS - 1)).records
    record = copy.deepcopy(base[0])
    record.update(
        env=PAYLOAD_ENV,
        group=max(r["group"] for r in base) + 1,
        success=True,
        end="terminated",
        total_reward=10.0,
    )
    turn = record["turns"][0]
    turn.update(
        reply=PAYLOAD_REPLY,
        think="<script>window.__pwned=1;console.log('pwned')</script>",
        answer="<img src=x onerror=\"window.__pwned=3;console.log('pwned')\">",
        observation="<script>window.__pwned=5</script>\n#####\n#P_O#\n#####",
        actions=['<svg onload="window.__pwned=6">'],
        rewards=[10.0],
        problems=['<b onmouseover="window.__pwned=7">nested_tag</b>'],
        format_ok=True,
    )
    return record


@pytest.fixture(scope="session")
def planted_run(viewer_run, tmp_path_factory) -> Path:
    """A copy of the real run whose last step also holds a broken line, a hostile episode
    and a torn last line; plus an alerts.jsonl with one collapse warning."""
    run = tmp_path_factory.mktemp("planted") / "planted-run"
    shutil.copytree(viewer_run, run)
    episode = planted_episode(run)
    with open(RunDir(run).trajectory_file(STEPS - 1), "a", encoding="utf-8") as fh:
        fh.write('{"env": "sokoban", "group": \n')  # a torn line healed by the next append
        fh.write(to_json_line(episode) + "\n")
        fh.write('{"env": "sokoban", "gro')  # killed mid-write: no newline
    RunDir(run).alerts.write_text(json.dumps(PLANTED_ALERT) + "\n", encoding="utf-8")
    return run
