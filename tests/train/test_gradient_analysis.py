"""RAGEN-2's gradient reporter (trainer.gradient_analysis_every) on the tiny model:

- each bucket's norms equal those of a separate backward on exactly its rows: one plain
  forward of the whole bucket (no micro-batches, no shared opening, no ragen forward code),
  its loss terms written out here, each term's gradient taken alone;
- a step with the reporter on is the step with it off: the same metrics and the same weights
  after it, on the on-policy path (the critic trained first) and on a scored one.
"""

from __future__ import annotations

import pytest
import torch

from ragen import config
from ragen.algos import kl_penalty
from ragen.algos.buckets import row_buckets
from ragen.rollout.expert import ExpertGenerator
from ragen.train import gradient_analysis
from ragen.train.state import RunState
from ragen.train.trainer import Trainer
from ragen.train.update import UpdateData

# Sokoban played by the solver, one turn (the cheapest rows: the reporter's sums over a row
# do not depend on how many reply segments it holds): 4 groups of 2 episodes, all kept, in
# micro-batches of 2 rows (so each bucket of 4 rows runs 2, which share their opening).
SMALL = [
    "model.spec=tiny",
    "rollout.groups=4",
    "rollout.group_size=2",
    "rollout.max_turns=1",
    "rollout.max_actions_per_turn=1",
    "rollout.max_reply_tokens=96",
    "rollout.demos=0",
    "algo.filter_ratio=1",
    "algo.estimator=gae",
    "algo.kl_coef=0.1",
    "algo.entropy_coef=0.01",
    "trainer.mini_batch_size=8",
    "trainer.micro_batch_size=2",
    "trainer.update_dtype=float32",
    "trainer.actor_lr=1e-3",
    "trainer.critic_lr=1e-3",
    "trainer.eval_every=0",
    "trainer.gradient_analysis_buckets=2",
    "logging.progress=false",
    "logging.tensorboard=false",
]


def _trainer(*overrides: str) -> Trainer:
    """A trainer whose episodes the solver plays, group g's second episode paid 0.3 (3 - g)
    more than its first: group g's return std is 0.15 (3 - g), the later groups vary less."""
    trainer = Trainer(config.load("sokoban-rl", [*SMALL, *overrides]))
    trainer.generator = ExpertGenerator(trainer.m.tokenizer, trainer.spec)
    collect = trainer.collect

    def varied(step: int):
        episodes = collect(step)
        if trainer.rollouts_step == step:  # fresh this step: pay once
            for i, episode in enumerate(episodes):
                episode.turns[-1].reward += 0.3 * (3 - episode.group) * (i % 2)
        return episodes

    trainer.collect = varied  # type: ignore[method-assign]
    return trainer


def _direct_norms(trainer: Trainer, data: UpdateData) -> dict[str, float]:
    """The gradient norm of each loss term of the rows ``data``, from one plain forward of
    them all: the token mean over their sampled tokens, as algo.loss_agg=token_mean has it."""
    c, policy, critic = trainer.config, trainer.m.policy, trainer.m.critic
    assert c.algo.aggregation() == "token_mean" and c.rollout.temperature == 1.0
    ids, mask = data.input_ids, data.attention_mask
    on = data.loss_mask[:, 1:] > 0  # (B, T-1): token t+1 sampled, read from position t
    hidden = policy.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = policy.get_output_embeddings()(hidden[:, :-1][on]).float()  # (N, V)
    log_softmax = logits.log_softmax(dim=-1)
    logp = log_softmax.gather(-1, ids[:, 1:][on][:, None])[:, 0]  # (N,) sampled tokens
    entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1)  # (N,)
    assert data.advantages is not None and data.returns is not None
    assert data.ref_logprobs is not None and data.old_values is not None
    adv, ref = data.advantages[:, 1:][on], data.ref_logprobs[:, 1:][on]
    old = logp.detach() if data.old_logprobs is None else data.old_logprobs[:, 1:][on]
    ratio = torch.exp(logp - old)  # 1 up to rounding: the reporter runs before the update

    body = critic.body(input_ids=ids, attention_mask=mask).last_hidden_state
    values = critic.head(body).squeeze(-1)[:, :-1][on]  # (N,): V of the state before token
    v_old, v_ret = data.old_values[:, 1:][on], data.returns[:, 1:][on]
    clipped = v_old + (values - v_old).clamp(-c.algo.value_clip, c.algo.value_clip)
    value_tok = 0.5 * torch.maximum((values - v_ret) ** 2, (clipped - v_ret) ** 2)
    terms = {  # each the mean over the sampled tokens (N,)
        "task": (-adv * ratio).mean(),
        "entropy": -c.algo.entropy_coef * entropy.mean(),
        "kl": c.algo.kl_coef * kl_penalty(logp, ref, c.algo.kl_type).mean(),
        "value": value_tok.mean(),
    }
    norms = {}
    for term, loss in terms.items():
        model = critic if term == "value" else policy
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        norms[term] = float(torch.cat([g.flatten() for g in grads if g is not None]).norm())
    return norms


def test_bucket_norms_equal_a_separate_backward_on_the_same_rows():
    # 3 groups in 2 buckets: 3 // 2 = 1 group in bucket_1, the other 2 in bucket_2
    trainer = _trainer("rollout.groups=3", "trainer.mini_batch_size=6")
    kept, _ = trainer.filter(trainer.collect(0))
    assert len(kept) == 6
    data = trainer.prepare(kept, estimate=True)  # the update would estimate them itself
    assert data.old_logprobs is None and data.advantages is not None
    returns = torch.tensor([t.total_reward for t in kept])
    groups = torch.tensor([t.group for t in kept])
    got = gradient_analysis.bucket_norms(
        trainer.m.policy, trainer.m.critic, data, returns, groups, trainer.settings(), 2
    )
    bucket, std = row_buckets(returns, groups, 2)
    assert bucket.tolist() == [1, 1, 1, 1, 0, 0]  # group 2 varies least
    assert std.tolist() == pytest.approx([0.45, 0.45, 0.3, 0.3, 0.15, 0.15])
    assert all(p.grad is None for p in trainer.m.policy.parameters())
    rows = {"all": torch.arange(6), "bucket_1": torch.arange(4, 6), "bucket_2": torch.arange(4)}
    for name, index in rows.items():  # bucket_2 and all in 2 and 3 micro-batches
        part = data.rows(index)
        want = _direct_norms(trainer, part)
        for term in ("task", "entropy", "kl", "value"):
            assert want[term] > 0, (name, term)
            key = f"grad_norm/{name}/{term}"
            assert got[key] == pytest.approx(want[term], rel=1e-4), key
        assert got[f"grad_norm/{name}/rows"] == len(index)
        assert got[f"grad_norm/{name}/tokens"] == float(part.loss_mask.sum())
    spread = {k: got[f"grad_norm/bucket_2/reward_std_{k}"] for k in ("min", "max")}
    assert spread == pytest.approx({"min": 0.3, "max": 0.45})
    assert got["grad_norm/all/reward_std_min"] == pytest.approx(0.15)


def _two_steps(*overrides: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The metrics of two steps and the weights (policy and critic) after them."""
    trainer, state = _trainer(*overrides), RunState()
    metrics = [trainer.step(step, state)[0] for step in range(2)]
    weights = {f"policy.{k}": v for k, v in trainer.m.policy.state_dict().items()}
    weights |= {f"critic.{k}": v for k, v in trainer.m.critic.state_dict().items()}
    return metrics, weights


def _stable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "perf/", "grad_norm/"))}


@pytest.mark.parametrize(
    "overrides",
    [[], ["trainer.mini_batch_size=2"]],
    ids=["on-policy", "scored"],
)
def test_a_step_with_the_reporter_is_the_step_without_it(overrides):
    # the first step analysed, the second not: both as they are without the reporter; two
    # groups of two, so a bucket of one group each; two mini-batches make the update score
    overrides = ["rollout.groups=2", "trainer.mini_batch_size=4", *overrides]
    on, on_weights = _two_steps(*overrides, "trainer.gradient_analysis_every=2")
    off, off_weights = _two_steps(*overrides)
    assert [_stable(m) for m in on] == [_stable(m) for m in off]
    assert on[0]["actor/optimizer_steps"] > 0
    assert on_weights.keys() == off_weights.keys()
    for key, value in on_weights.items():
        assert torch.equal(value, off_weights[key]), key
    terms = ("task", "entropy", "kl", "value")
    want = {f"grad_norm/{b}/{t}" for b in ("all", "bucket_1", "bucket_2") for t in terms}
    assert want <= set(on[0])
    assert not any(k.startswith("grad_norm/") for m in [on[1], *off] for k in m)


def test_the_reporter_runs_every_n_steps_from_the_first():
    assert [s for s in range(7) if gradient_analysis.due(3, s)] == [0, 3, 6]
    assert not any(gradient_analysis.due(0, s) for s in range(7))


def test_a_term_the_loss_lacks_is_not_reported():
    trainer = _trainer("algo.kl_coef=0", "algo.entropy_coef=0")
    kept, _ = trainer.filter(trainer.collect(0))
    data = trainer.prepare(kept, estimate=True)
    assert gradient_analysis.loss_terms(trainer.settings(), data, trainer.m.critic) == [
        "task",
        "value",
    ]
    returns = torch.tensor([t.total_reward for t in kept])
    got = gradient_analysis.bucket_norms(
        trainer.m.policy,
        None,  # no critic: no value term
        data,
        returns,
        torch.tensor([t.group for t in kept]),
        trainer.settings(),
        6,  # more buckets than the 4 groups: one group each, bucket_5 and _6 empty
    )
    norms = {k for k in got if not k.endswith(("rows", "tokens", "std_min", "std_max"))}
    buckets = ("all", "bucket_1", "bucket_2", "bucket_3", "bucket_4")
    assert norms == {f"grad_norm/{b}/task" for b in buckets}
    assert got["grad_norm/bucket_1/task"] > 0  # the constant group's advantages: GAE's, not 0


def test_turn_sample_rows_are_bucketed_by_their_episodes_groups():
    # two turns of one action each, a sample per turn: each group's spread is taken over its
    # two episodes (0.15 (3 - g)), whatever number of turn samples each episode gave
    trainer = _trainer(
        "rollout.max_turns=2",
        "rollout.context_window=single_turn",
        "rollout.context_turns=1",
        "trainer.gradient_analysis_every=1",
        "algo.kl_coef=0",  # the buckets, not the terms, are under test: the fewest terms
        "algo.entropy_coef=0",
    )
    kept, _ = trainer.filter(trainer.collect(0))
    data = trainer.prepare(kept, estimate=True)
    assert data.episodes is not None and len(data.episodes) > len(kept)
    got = trainer.analyse_gradients(data, kept, 0)
    assert got["grad_norm/all/rows"] == len(data.episodes)
    assert got["grad_norm/all/reward_std_min"] == pytest.approx(0.0)
    assert got["grad_norm/all/reward_std_max"] == pytest.approx(0.45)
    spread = {k: got[f"grad_norm/bucket_2/reward_std_{k}"] for k in ("min", "max")}
    assert spread == pytest.approx({"min": 0.3, "max": 0.45})
    # groups 2 and 3 (stds 0.15, 0) in bucket_1: the rows of their episodes
    assert got["grad_norm/bucket_1/rows"] == sum(kept[e].group >= 2 for e in data.episodes.tolist())
