"""The update's shortcuts, each held to a reference computed here on the same episodes (the
same gradients for both models and the same losses, in float32 on the tiny model):

- an exactly on-policy update (one epoch, one mini-batch) takes its old log-probs from its own
  forward and, with gae or bi_level_gae, trains the critic first and estimates the advantages
  from that forward's values, so no scoring pass runs: against the same trainer made to score
  first, as every off-policy update does;
- the opening every row shares runs once per mini-batch (and once per scoring pass): against
  micro-batches that each run their own (``openings.py``);
- micro-batches hold rows of like length: against the whole mini-batch in one micro-batch.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from tests.small import SOKOBAN_UPDATE
from tests.train.openings import each_micro_batch_runs_its_opening

from ragen import config
from ragen.rollout.expert import ExpertGenerator
from ragen.train.trainer import Trainer
from ragen.train.update import UpdateSettings, by_length, mini_batch_rows, ppo_update


class GradientRecorder(torch.optim.SGD):
    """SGD at learning rate 0: the weights stay, and each step keeps a copy of the gradients
    the update produced."""

    def __init__(self, params):
        self.params = list(params)
        super().__init__(self.params, lr=0.0)
        self.grads: list[torch.Tensor] = []

    def step(self, closure=None):
        self.grads = [p.grad.detach().clone() for p in self.params]
        return super().step(closure)


def _trainer(*overrides: str) -> Trainer:
    return Trainer(config.load("sokoban-rl", [*SOKOBAN_UPDATE, *overrides]))


def _scoring_first(trainer: Trainer) -> Trainer:
    """``trainer`` made to take a scoring pass before every update, as an off-policy update
    does: the reference of the on-policy shortcut."""
    trainer.on_policy = lambda kept: False  # type: ignore[method-assign]
    return trainer


def _episodes(trainer: Trainer):
    """Episodes the solver plays (the tiny model's own replies rarely close in a few tokens,
    and an unclosed reply ends the episode), with returns that differ inside each group."""
    trainer.generator = ExpertGenerator(trainer.m.tokenizer, trainer.spec)
    episodes = trainer.collect(0)
    for i, episode in enumerate(episodes):
        episode.turns[-1].reward += 0.25 * i
    return episodes


def _update(trainer: Trainer, episodes) -> tuple[dict, dict[str, list[torch.Tensor]]]:
    data, _ = trainer.weigh(trainer.prepare(episodes), episodes)
    recorders = {
        "actor": GradientRecorder(p for p in trainer.m.policy.parameters() if p.requires_grad)
    }
    if trainer.m.critic is not None:
        recorders["critic"] = GradientRecorder(trainer.m.critic.parameters())
    c = trainer.config
    settings = UpdateSettings(c.algo, c.trainer, c.rollout.temperature, None)
    metrics = ppo_update(trainer.m.policy, trainer.m.critic, recorders, data, settings, seed=0)
    return metrics, {name: r.grads for name, r in recorders.items()}


@pytest.mark.parametrize(
    "overrides",
    [
        # discounted, so each token's advantage reads the next one's value too, and with a
        # KL penalty, so the reference model scores the rows as well (the two others run
        # without one)
        ["algo.estimator=gae", "algo.lam=0.9", "algo.gamma=0.95", "algo.kl_coef=0.1"],
        ["algo.estimator=bi_level_gae"],
        ["algo.estimator=grpo"],
    ],
    ids=["gae-lam0.9-kl", "bi_level_gae", "grpo"],
)
def test_an_on_policy_update_without_a_scoring_pass_takes_the_same_step(overrides):
    shortcut = _trainer(*overrides)
    scored = _scoring_first(_trainer(*overrides))
    episodes = _episodes(shortcut)
    assert all(len(t.turns) >= 2 for t in episodes)  # several reply segments in a row

    data = shortcut.prepare(episodes)
    assert data.old_logprobs is None  # the update's own forward gives them
    has_critic = shortcut.m.critic is not None
    assert (data.advantages is None) == has_critic  # the critic goes first
    assert scored.prepare(episodes).old_logprobs is not None

    got, got_grads = _update(shortcut, episodes)
    want, want_grads = _update(scored, episodes)
    assert (
        got_grads.keys() == want_grads.keys() == ({"actor", "critic"} if has_critic else {"actor"})
    )
    for name in want_grads:
        for g, w in zip(got_grads[name], want_grads[name], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
    for key in (
        "actor/pg_loss",
        "actor/entropy",
        "critic/value_loss",
        "critic/explained_var",
        "actor/grad_norm",
        "critic/grad_norm",
        "actor/kl",
    ):
        if key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-7), key
    assert got["actor/ratio_mean"] == 1.0  # the old policy is exactly the one that is trained
    assert got["actor/optimizer_steps"] == want["actor/optimizer_steps"] == 1


@pytest.mark.parametrize(
    "overrides",
    [["trainer.ppo_epochs=2"], ["trainer.mini_batch_size=2"]],
    ids=["two-epochs", "two-mini-batches"],
)
def test_an_update_that_is_not_on_policy_scores_first(overrides):
    trainer = _trainer(*overrides)
    data = trainer.prepare(_episodes(trainer))
    assert data.old_logprobs is not None and data.old_values is not None
    assert data.advantages is not None


def test_advantages_weighted_by_the_filter_come_from_a_values_pass():
    # algo.filter_loss_scaling scales the advantages before the update, so an on-policy
    # update with gae takes its values from a scoring pass rather than training the critic
    # first; the old log-probs still come from its own forward. 1 of 2 groups kept: sqrt(1/2).
    overrides = [
        "algo.estimator=gae",
        "algo.filter_loss_scaling=sqrt",
        "algo.filter_ratio=0.5",
        "trainer.mini_batch_size=2",
        "trainer.micro_batch_size=1",
    ]
    shortcut = _trainer(*overrides)
    kept, _ = shortcut.filter(_episodes(shortcut))
    assert len(kept) == 2 and shortcut.on_policy(len(kept))
    data = shortcut.prepare(kept)
    assert data.old_logprobs is None and data.advantages is not None
    weighted, _ = shortcut.weigh(data, kept)
    torch.testing.assert_close(weighted.advantages, data.advantages * 0.5**0.5)

    got, got_grads = _update(shortcut, kept)
    want, want_grads = _update(_scoring_first(_trainer(*overrides)), kept)
    for name in ("actor", "critic"):
        for g, w in zip(got_grads[name], want_grads[name], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
    for key in ("actor/pg_loss", "critic/value_loss", "actor/grad_norm", "critic/grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-7), key


def _assert_same_step(got_trainer: Trainer, want_trainer: Trainer, *, reference=nullcontext):
    """The two trainers' updates on the same episodes give the same gradients and losses;
    ``want_trainer``'s runs inside ``reference()``."""
    episodes = _episodes(got_trainer)
    got, got_grads = _update(got_trainer, episodes)
    with reference():
        want, want_grads = _update(want_trainer, episodes)
    for name in want_grads:
        for g, w in zip(got_grads[name], want_grads[name], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
    assert got.keys() == want.keys()
    for key in ("actor/pg_loss", "actor/entropy", "critic/value_loss", "actor/grad_norm"):
        if key in want:  # critic/value_loss: with a critic
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-7), key


@pytest.mark.parametrize("scored", [False, True], ids=["on-policy", "scored-first"])
def test_the_opening_run_once_per_mini_batch_takes_the_same_step(scored):
    # the opening once for the update's two micro-batches (and once for the scoring pass's),
    # against once for each of them
    once, each = _trainer("algo.estimator=gae"), _trainer("algo.estimator=gae")
    if scored:
        once, each = _scoring_first(once), _scoring_first(each)
    _assert_same_step(once, each, reference=each_micro_batch_runs_its_opening)


def test_micro_batches_of_rows_of_like_length_take_the_same_step():
    # four micro-batches of one row, cut longest first, against the mini-batch in one
    sorted_ = _trainer("algo.estimator=gae", "trainer.micro_batch_size=1")
    whole = _trainer("algo.estimator=gae", "trainer.micro_batch_size=4")
    _assert_same_step(sorted_, whole)


def test_dr_grpo_takes_the_step_of_the_two_settings_it_stands_for():
    dr = _trainer("algo.estimator=grpo", "algo.dr_grpo=true")
    spelled = _trainer(
        "algo.estimator=grpo", "algo.grpo_norm_by_std=false", "algo.loss_agg=seq_mean_token_sum"
    )
    episodes = _episodes(dr)
    advantages = dr.prepare(episodes).advantages
    assert advantages is not None
    torch.testing.assert_close(advantages, spelled.prepare(episodes).advantages)
    # returns 0.25 apart inside each group of two: centred ±0.125, not divided by the std
    sampled = advantages[advantages != 0]
    torch.testing.assert_close(sampled.abs(), torch.full_like(sampled, 0.125))
    _assert_same_step(dr, spelled)


def test_rows_go_longest_first_ties_in_their_order():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]])
    rows = torch.tensor([4, 0, 2, 1, 3])
    assert by_length(rows, mask).tolist() == [1, 3, 4, 0, 2]
    # the update's mini-batches: one permutation per epoch, cut, each sorted
    minis = list(mini_batch_rows(mask, epochs=2, size=3, seed=0))
    assert [len(m) for m in minis] == [3, 2, 3, 2]
    for m in minis:
        lengths = mask[m].sum(dim=1).tolist()
        assert lengths == sorted(lengths, reverse=True)
    generator = torch.Generator().manual_seed(0)
    plain = [m for _ in range(2) for m in torch.randperm(5, generator=generator).split(3)]
    for a, b in zip(minis, plain, strict=True):
        assert sorted(a.tolist()) == sorted(b.tolist())  # the same rows, reordered
