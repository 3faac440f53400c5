"""A critic cut to the policy's first decoder layers (model.critic_layers): the values of
those layers under the final norm and the head, the policy untouched, a run that trains it
and saves only what it holds."""

import copy

import pytest
import torch
from safetensors.torch import load_file
from tests.small import NO_TENSORBOARD, TINY_RL

from ragen import config, models
from ragen.run.rundir import create_run_dir
from ragen.train import checkpoint
from ragen.train.forward import SharedOpening, state_values
from ragen.train.loop import RunLoop
from ragen.train.trainer import Trainer

# One quick step of the tiny model on Bandit with a critic that learns fast.
ONE_STEP = [*TINY_RL, NO_TENSORBOARD, "trainer.steps=1", "trainer.critic_lr=1e-3"]


def _rows(vocab: int):
    """Three right-padded rows opening with the same 20 tokens: (ids, mask), (3, 30)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (3, 30), generator=g)
    ids[:, :20] = ids[0, :20]
    mask = torch.ones_like(ids)
    mask[1, 26:] = 0
    mask[2, 23:] = 0
    return ids * mask, mask


def test_a_cut_critic_reads_the_first_layers_of_the_policy_and_leaves_the_policy_whole(tiny):
    policy = copy.deepcopy(tiny[0])
    critic = models.ValueModel(copy.deepcopy(policy), layers=1)
    torch.nn.init.normal_(critic.head.weight, std=0.1)  # a zero head would hide any error
    assert len(critic.body.layers) == critic.config.num_hidden_layers == 1
    assert len(policy.get_decoder().layers) == policy.config.num_hidden_layers == 2

    ids, mask = _rows(policy.config.vocab_size)
    # The whole policy's hidden state after its first layer, under its final norm, then the
    # head: the value of the state before each next token.
    out = policy.get_decoder()(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    first = policy.get_decoder().norm(out.hidden_states[1])
    want = torch.nn.functional.pad(critic.head(first).squeeze(-1)[:, :-1], (1, 0))
    real = mask.bool()
    real[:, 0] = False
    with torch.no_grad():
        got = state_values(critic, ids, mask)
        # the shared opening sizes its cache from the cut config: one layer of keys/values
        opening = SharedOpening(critic.body, ids, mask)
        shared = state_values(critic, ids, mask, opening)
    torch.testing.assert_close(got[real], want.detach()[real], atol=1e-5, rtol=1e-5)
    assert opening.length == 20 and len(opening._outputs) == 1 + 2
    torch.testing.assert_close(shared[real], got[real], atol=1e-5, rtol=1e-5)


def test_more_critic_layers_than_the_model_has_are_refused_with_the_range(tiny):
    refusal = r"critic_layers=3: the model has 2 decoder layers; pick 1 to 2"
    with pytest.raises(models.ModelError, match=refusal):
        models.ValueModel(copy.deepcopy(tiny[0]), layers=3)


def test_config_refuses_zero_critic_layers():
    with pytest.raises(config.ConfigError, match=r"model\.critic_layers"):
        config.load("bandit", ["model.critic_layers=0"])


def test_a_run_trains_the_cut_critic_and_checkpoints_only_its_layer(tmp_path):
    cfg = config.load("bandit", [*ONE_STEP, "model.critic_layers=1"])
    run = create_run_dir(tmp_path / "run", cfg)
    trainer = Trainer(cfg)
    before = copy.deepcopy(trainer.m.critic.state_dict())
    RunLoop(trainer, run).train()
    after = trainer.m.critic.state_dict()
    assert len(trainer.m.critic.body.layers) == 1
    assert len(trainer.m.policy.get_decoder().layers) == 2
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the critic trained
    saved = load_file(checkpoint.complete_checkpoints(run)[-1] / "critic_trainable.safetensors")
    assert any(".layers.0." in k for k in saved)
    assert not any(".layers.1." in k for k in saved)
