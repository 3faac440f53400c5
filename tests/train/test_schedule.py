"""The learning-rate schedule: linear warm-up, decay and the cut per rollback, by hand."""

import math

import pytest
import torch

from ragen import config
from ragen.train.schedule import lr_scale, set_learning_rates, set_sft_learning_rate


def test_warmup_rises_linearly_then_holds():
    assert [lr_scale(s, 3) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])


def test_no_warmup_is_the_full_rate_from_the_first_step():
    assert [lr_scale(s, 0) for s in range(3)] == [1.0, 1.0, 1.0]


def test_each_rollback_multiplies_the_warmed_rate():
    assert lr_scale(0, 1, rollbacks=2, rollback_scale=0.5) == pytest.approx(0.5 * 0.25)
    assert lr_scale(7, 1, rollbacks=1, rollback_scale=0.5) == pytest.approx(0.5)


def test_negative_inputs_are_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        lr_scale(-1, 3)


def test_linear_decay_falls_after_the_warmup_towards_zero_one_step_past_the_end():
    # warm-up 1 of 5 steps: step 0 at 1/2, then progress 0, 1/4, 2/4, 3/4 of the 4 left
    got = [lr_scale(s, 1, decay="linear", steps=5) for s in range(5)]
    assert got == pytest.approx([0.5, 1.0, 0.75, 0.5, 0.25])


def test_cosine_decay_and_a_rollback_multiply():
    got = [lr_scale(s, 0, decay="cosine", steps=4) for s in range(4)]
    assert got == pytest.approx([1.0, (1 + math.sqrt(0.5)) / 2, 0.5, (1 - math.sqrt(0.5)) / 2])
    assert lr_scale(2, 0, 1, 0.5, decay="cosine", steps=4) == pytest.approx(0.25)


def test_the_optimisers_take_the_decayed_rates():
    c = config.load("sokoban-rl", ["trainer.lr_decay=linear", "trainer.steps=4"])
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizers = {name: torch.optim.AdamW([weight]) for name in ("actor", "critic")}
    set_learning_rates(optimizers, c, 3, 0)
    assert optimizers["actor"].param_groups[0]["lr"] == pytest.approx(c.trainer.actor_lr / 4)
    assert optimizers["critic"].param_groups[0]["lr"] == pytest.approx(c.trainer.critic_lr / 4)
    sft = config.load("sokoban-rl", ["trainer.lr_decay=linear", "sft.steps=8", "sft.lr=1e-3"])
    assert set_sft_learning_rate(optimizers["actor"], sft, 6) == pytest.approx(2.5e-4)
    assert optimizers["actor"].param_groups[0]["lr"] == pytest.approx(2.5e-4)


def test_an_unknown_decay_is_refused():
    with pytest.raises(ValueError, match="none, linear or cosine"):
        lr_scale(0, 0, decay="step", steps=3)
