"""End to end on the tiny model: a reward the policy can learn moves it the right way.

The setting is the smallest real one with a learnable signal: Bandit with its arms named Cat
and Dog (one token each, so both answers end in the same tokens) and the risky arm paying 1
every time (``high_prob: 1``), so one arm always pays 1 and the other always 0.15. A random
tiny model never writes a well-formed answer, so it first gets a cold start: supervised
steps on the expert's replies for both arms in equal numbers. The prompts are the same
whichever arm pays, so it learns the format and picks either arm about as often. Then the
real trainer (rollouts, StarPO-S filter, GRPO, PPO update) runs a few steps, and what moves
is measured exactly: the probability that the policy samples the paying arm's reply.
"""

from __future__ import annotations

import json

import pytest
import torch

from ragen import config, models
from ragen.rollout.expert import expert_dialogues
from ragen.rollout.loop import RolloutSpec
from ragen.rollout.trajectory import collate
from ragen.run.rundir import RunDir, create_run_dir
from ragen.train.forward import token_logprobs
from ragen.train.loop import RunLoop
from ragen.train.setup import adamw
from ragen.train.sft import supervised_update
from ragen.train.trainer import Trainer

ARMS = ("Cat", "Dog")
TINY = [
    "model.spec=tiny",
    "model.dtype=float32",
    "rollout.think=false",  # the reply is <answer>Cat</answer>: four tokens after the prefix
    "rollout.demos=0",
    "rollout.max_reply_tokens=8",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.save_trajectories=false",
    "trainer.eval_every=0",
    "trainer.save_every=0",
]
COLD_START_STEPS = 70
HELD_OUT = list(range(500, 532))  # prompts of no training step (those use seeds from 1000)


def _options(pays: str) -> dict:
    return {"arm_names": list(ARMS), "high_risk": pays, "high_prob": 1.0}


def _reply_probability(policy, tokenizer, spec: RolloutSpec, arm: str) -> float:
    """Mean over the held-out prompts of the probability that a T=1 sample is exactly the
    reply picking ``arm`` (the expert's reply, token for token)."""
    dialogues = expert_dialogues(tokenizer, "bandit", HELD_OUT, spec, env_options=_options(arm))
    batch = collate(dialogues, tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logprobs(
            policy, batch.input_ids, batch.attention_mask, batch.loss_mask, with_entropy=False
        )
    return float(logp.sum(-1).exp().mean())  # (B, T) per token -> per reply -> mean


@pytest.fixture(scope="module")
def cold_start(tmp_path_factory):
    """The tiny model after supervised steps on expert replies, half for each arm, saved as
    a model folder; and the probability of each arm's reply then."""
    cfg = config.load("bandit", TINY)
    spec = RolloutSpec.from_config(cfg.rollout)
    policy, tokenizer = models.load_policy("tiny", dtype="float32")
    # 5e-3: the loss falls smoothly to its floor by step 50 (a 2-core Xeon with AMX). At
    # 1e-2 it spiked (7.5 at step 50 there) and ended where the kernels' rounding led it:
    # each arm's reply at 0.47-0.48 on the EPYC the test was written on, 0.12-0.14 there.
    optimizer = adamw(policy, 5e-3, cfg)
    for step in range(COLD_START_STEPS):
        seeds = list(range(1000 + 4 * step, 1004 + 4 * step))
        dialogues = [
            d
            for arm in ARMS
            for d in expert_dialogues(tokenizer, "bandit", seeds, spec, env_options=_options(arm))
        ]
        batch = collate(dialogues, tokenizer.pad_token_id)
        supervised_update(policy, optimizer, batch, micro_batch_size=8, grad_clip=1.0)
    folder = tmp_path_factory.mktemp("cold-start")
    policy.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    before = {arm: _reply_probability(policy, tokenizer, spec, arm) for arm in ARMS}
    return folder, before


@pytest.mark.parametrize("pays", ARMS)
def test_rl_raises_the_probability_of_the_paying_arm(cold_start, tmp_path, pays):
    """Five StarPO-S steps with GRPO at lr 1e-3, 16 rollouts a step, seeded. Both runs start
    from the same cold start and differ only in which arm pays, so a move toward the paying
    arm in both is the reward's doing, not drift (weight decay, the entropy bonus, the
    format still being learned). Measured on a 2-core Xeon with AMX: each arm's reply
    0.49-0.50 after the cold start; after the steps the paying arm's 0.73-0.76 and the
    other's 0.23-0.26 (trainer seed 0, either arm paying)."""
    folder, before = cold_start
    other = next(arm for arm in ARMS if arm != pays)
    # The start leans toward neither arm and writes the format: RL decides the choice.
    assert all(0.4 < p < 0.6 for p in before.values()), before
    assert sum(before.values()) > 0.9, before
    cfg = config.load(
        "bandit",
        [
            *TINY,
            f"model.spec={folder}",
            f"env.options={json.dumps(_options(pays))}",
            "algo.estimator=grpo",
            "trainer.actor_lr=1e-3",
            "trainer.steps=5",
            "rollout.groups=4",
            "rollout.group_size=4",
            "trainer.mini_batch_size=8",
            "trainer.micro_batch_size=8",
        ],
    )
    run = RunDir(tmp_path / "run")
    create_run_dir(run.root, cfg)
    trainer = Trainer(cfg)
    RunLoop(trainer, run).train()
    spec = RolloutSpec.from_config(cfg.rollout)
    after = {a: _reply_probability(trainer.m.policy, trainer.m.tokenizer, spec, a) for a in ARMS}
    assert after[pays] > before[pays] + 0.1, (before, after)
    assert after[other] < before[other] - 0.1, (before, after)
