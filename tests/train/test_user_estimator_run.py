"""A run with an estimator of the user's own (algo.estimator=package.module:function) on the
tiny model: the trainer imports it as the run starts, builds a critic only when algo.critic
says so, and trains on what it returns."""

from __future__ import annotations

import sys

import pytest
import torch

from ragen import config
from ragen.config import ConfigError
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train.loop import RunLoop
from ragen.train.preflight import check_runnable
from ragen.train.resume import check_resume
from ragen.train.trainer import Trainer

MODULE = "ragen_test_run_estimators"
SOURCE = """
import torch


def half_return(*, mask, scores, **_):
    # half the episode's return on each of its sampled tokens; no critic
    adv = torch.where(mask != 0, 0.5 * scores[:, None], 0.0)
    return adv, adv.clone()


def return_minus_value(*, mask, values, scores, **_):
    # the episode's return less the critic's value; the return is the critic's target
    returns = torch.where(mask != 0, scores[:, None], 0.0)
    return torch.where(mask != 0, returns - values, 0.0), returns
"""
# Bandit: one turn per episode, the cheapest real rollout; every group kept.
SMALL = [
    "model.spec=tiny",
    "rollout.groups=2",
    "rollout.group_size=2",
    "rollout.max_reply_tokens=4",
    "rollout.demos=0",
    "algo.filter_ratio=1",
    "trainer.steps=1",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=4",
    "trainer.eval_every=0",
    "trainer.actor_lr=1e-3",
    "logging.progress=false",
    "logging.tensorboard=false",
]


@pytest.fixture(autouse=True)
def user_module(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    yield
    sys.modules.pop(MODULE, None)


def _config(function: str, *overrides: str) -> config.Config:
    return config.load("bandit", [*SMALL, f"algo.estimator={MODULE}:{function}", *overrides])


def _returns_by_index(episodes):
    """Episode i returns i, so every advantage is known by hand."""
    for i, episode in enumerate(episodes):
        for turn in episode.turns:
            turn.reward = 0.0
        episode.turns[-1].reward = float(i)
    return episodes


def test_a_user_estimator_without_a_critic_gives_the_update_its_advantages():
    trainer = Trainer(_config("half_return"))
    assert trainer.m.critic is None and "critic" not in trainer.m.optimizers
    data = trainer.prepare(_returns_by_index(trainer.collect(0)))
    # not whitened (algo.whiten_advantages is null): 0.5 * i on episode i's reply tokens
    rows = torch.arange(len(data.loss_mask), dtype=torch.float32)[:, None]
    torch.testing.assert_close(data.advantages, 0.5 * rows * data.loss_mask)


def test_a_user_estimator_with_algo_critic_trains_one_step_with_the_critic(tmp_path):
    cfg = _config("return_minus_value", "algo.critic=true")
    trainer = Trainer(cfg)
    assert trainer.m.critic is not None and "critic" in trainer.m.optimizers
    data = trainer.prepare(_returns_by_index(trainer.collect(0)))
    assert data.old_values is not None  # the estimator read the critic's values
    rows = torch.arange(len(data.loss_mask), dtype=torch.float32)[:, None] * data.loss_mask
    torch.testing.assert_close(data.returns, rows)
    torch.testing.assert_close(data.advantages, (rows - data.old_values) * data.loss_mask)

    before = [p.detach().clone() for p in trainer.m.critic.parameters()]
    run = create_run_dir(tmp_path / "run", cfg)
    RunLoop(trainer, run).train()
    record = read_jsonl(run.metrics).records[0]
    assert {"actor/pg_loss", "critic/value_loss"} <= set(record)
    after = trainer.m.critic.parameters()
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


def test_an_estimator_that_cannot_be_imported_is_refused_before_the_run_starts():
    cfg = _config("missing")  # the shape of the name is right: the config loads
    with pytest.raises(ConfigError, match=f"'{MODULE}:missing' cannot be imported"):
        check_runnable(cfg)  # what `ragen train` runs before it makes the run folder
    with pytest.raises(ConfigError, match="has no attribute 'missing'"):
        Trainer(cfg)  # before a model loads


def test_a_resume_that_adds_or_drops_the_critic_of_a_user_estimator_is_refused(tmp_path):
    saved = _config("return_minus_value", "algo.critic=true")
    asked = _config("return_minus_value")
    with pytest.raises(ConfigError, match=r"^config: algo\.critic=null cannot apply") as err:
        check_resume(RunDir(tmp_path / "run"), saved, asked)
    assert "hold a critic" in str(err.value) and "algo.critic=true" in str(err.value)
    check_resume(RunDir(tmp_path / "run"), saved, saved)  # the same settings resume
