"""The update's micro-batches cut to the memory free (update_memory.py): the estimate from the
models' shapes, the split of rows given longest first, and real updates of the tiny model
that take the same step whether memory cuts their micro-batches or not."""

from __future__ import annotations

import pytest
import torch
from tests.small import SOKOBAN_UPDATE

from ragen import config
from ragen import metric_names as names
from ragen.rollout.expert import ExpertGenerator
from ragen.train import update_memory
from ragen.train.trainer import Trainer
from ragen.train.update import ppo_update
from ragen.train.update_memory import DecoderBytes, MemoryPlan, micro_batch_bytes, split


def test_the_embedded_model_keeps_per_token_what_its_shapes_say(embedded):
    # SmolLM2-135M: 30 layers, hidden 576, MLP 1,536, 9 heads of 64 over 3 key/value heads,
    # a 49,152-token vocabulary
    model, _ = embedded
    cost = DecoderBytes.of(model.config, head=True)
    assert cost == DecoderBytes(
        token=4 * 30 * (10 * 576 + 4 * 1536),  # 1,428,480: 1.36 MiB a token
        opening=4 * 30 * (2 * 576 + 2 * 192),
        head=4 * 8 * 49152,  # 1.5 MiB a scored token
    )
    body = DecoderBytes.of(model.config, head=False)
    assert body is not None and body.head == 0 and body.token == cost.token


def test_a_config_without_the_shapes_gives_no_estimate():
    class Partial:
        hidden_size, intermediate_size, num_hidden_layers = 64, 128, 2
        vocab_size, num_attention_heads = True, 4  # a bool is not a size

    assert DecoderBytes.of(Partial(), head=True) is None
    assert DecoderBytes.of(None, head=True) is None


def test_rows_fill_each_micro_batch_while_they_fit():
    cost = DecoderBytes(token=10, opening=1, head=100)
    # padded to its first (longest) row: 2 rows of 100 tokens, 20 of them shared, 5 + 5 scored
    assert micro_batch_bytes(cost, 2, 100, 20, 10) == 2 * (80 * 10 + 20 * 1) + 10 * 100
    widths, sampled = [100, 90, 50, 40, 10], [5, 5, 5, 5, 5]
    # 2,640 bytes hold two 100-token rows (2,640), not three (3 × 820 + 1,500 = 3,960); then
    # the three rows left, from the 50-token one (3 × 320 + 1,500 = 2,460)
    assert split(widths, sampled, 20, 4, 2640, cost) == [2, 3]
    # more room: the configured 4 rows at most
    assert split(widths, sampled, 20, 4, 10**9, cost) == [4, 1]
    # no room: one row each, however short
    assert split(widths, sampled, 20, 4, 0, cost) == [1, 1, 1, 1, 1]
    assert split([], [], 0, 4, 0, cost) == []


def test_a_plan_counts_the_mini_batches_it_cut():
    plan = MemoryPlan(budget=2640 + 20 * 10, policy=DecoderBytes(10, 1, 100), critic=None, most=2)
    mask = torch.tensor([[1] * 100, [1] * 90 + [0] * 10, [1] * 50 + [0] * 50])
    sampled = torch.zeros(3, 100, dtype=torch.bool)
    sampled[:, 10:15] = True
    both = plan.for_pass(policy=True, critic=True)  # no critic body: the policy's alone
    assert both.cost == plan.policy
    # the opening's own 20 tokens (20 × 10 bytes) come off the budget first
    assert both.sizes(mask, sampled, 20) == [2, 1] and plan.cuts == 0
    plan.budget = 0
    assert both.sizes(mask, sampled, 20) == [1, 1, 1] and plan.cuts == 1


def test_what_the_update_holds_beside_activations_and_a_first_step_adds(tiny):
    model, _ = tiny
    params = sum(p.numel() for p in model.parameters())
    adamw = torch.optim.AdamW(model.parameters(), lr=0.0)
    assert update_memory.trained_bytes(model, None) == 4 * params  # float32 gradients
    # before its first step: two moments, and the file's pages beside the weights' own copy
    assert update_memory.first_step_bytes({"actor": adamw}) == 16 * params
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    adamw.step()  # at learning rate 0: the shared test model stays as it was
    assert update_memory.first_step_bytes({"actor": adamw}) == 0
    for p in model.parameters():
        p.grad = None


def _trainer(*overrides: str) -> Trainer:
    return Trainer(config.load("sokoban-rl", [*SOKOBAN_UPDATE, "algo.estimator=gae", *overrides]))


def _episodes(trainer: Trainer):
    """Episodes the solver plays, with returns that differ inside each group."""
    trainer.generator = ExpertGenerator(trainer.m.tokenizer, trainer.spec)
    episodes = trainer.collect(0)
    for i, episode in enumerate(episodes):
        episode.turns[-1].reward += 0.25 * i
    return episodes


def _update(trainer: Trainer, episodes, *, plan: bool):
    """The update's metrics and the gradients it stepped with (SGD at learning rate 0)."""
    data, _ = trainer.weigh(trainer.prepare(episodes), episodes)
    grads: dict[str, list[torch.Tensor]] = {}

    def recorder(name, model):
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=0.0)
        step = opt.step

        def record(closure=None):
            grads[name] = [p.grad.detach().clone() for p in params]
            return step(closure)

        opt.step = record  # type: ignore[method-assign]
        return opt

    optimizers = {"actor": recorder("actor", trainer.m.policy)}
    if trainer.m.critic is not None:
        optimizers["critic"] = recorder("critic", trainer.m.critic)
    settings = trainer.settings()
    assert settings.plan_memory  # on a CPU
    settings = type(settings)(**{**vars(settings), "plan_memory": plan})
    metrics = ppo_update(trainer.m.policy, trainer.m.critic, optimizers, data, settings, seed=0)
    return metrics, grads


def test_an_update_short_of_memory_takes_the_step_of_one_row_micro_batches(monkeypatch):
    planned, single = _trainer(), _trainer("trainer.micro_batch_size=1")
    episodes = _episodes(planned)
    free, free_grads = _update(planned, episodes, plan=True)
    assert free[names.UPDATE_MEMORY_CUTS] == 0  # a tiny model's rows fit any machine
    monkeypatch.setattr(update_memory, "FREE_SHARE", 0.0)  # no memory to spare
    short, short_grads = _update(planned, episodes, plan=True)
    want, want_grads = _update(single, episodes, plan=False)
    # the one mini-batch's two passes, [2, 2] → [1, 1, 1, 1]: the critic's first (gae,
    # on-policy), then the policy's
    assert short[names.UPDATE_MEMORY_CUTS] == 2
    assert names.UPDATE_MEMORY_CUTS not in want
    for name in ("actor", "critic"):
        for got, expected in zip(short_grads[name], want_grads[name], strict=True):
            assert torch.equal(got, expected)  # the same micro-batches: the same floats
        for got, other in zip(short_grads[name], free_grads[name], strict=True):
            torch.testing.assert_close(got, other, rtol=1e-4, atol=1e-7)  # rounding apart
    for key in ("actor/pg_loss", "critic/value_loss", "actor/grad_norm"):
        assert short[key] == want[key]
        assert short[key] == pytest.approx(free[key], rel=1e-4, abs=1e-7)
