"""A critic that is only a value head on the policy's own decoder (model.critic_body=policy):
its values are the head on the policy's last hidden states, its loss trains the head alone,
the policy's update is the one a copied critic's run takes while both critics' values are
zero, and a checkpoint holds the head only."""

import copy

import pytest
import torch
from safetensors.torch import load_file
from tests.train.test_critic_layers import ONE_STEP, _rows

from ragen import config, models
from ragen.monitor.rundir import create_run_dir
from ragen.train import checkpoint
from ragen.train.forward import critic_opening, state_values
from ragen.train.trainer import Trainer, check_resume


def test_the_head_reads_the_policys_last_hidden_states_and_trains_alone(tiny):
    policy = copy.deepcopy(tiny[0])
    critic = models.TrunkValueHead(policy)
    torch.nn.init.normal_(critic.head.weight, std=0.1)  # a zero head would hide any error
    assert [name for name, _ in critic.named_parameters()] == ["head.weight", "head.bias"]
    assert list(critic.state_dict()) == ["head.weight", "head.bias"]

    ids, mask = _rows(policy.config.vocab_size)
    with torch.no_grad():
        last = policy.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    want = torch.nn.functional.pad(critic.head(last).squeeze(-1)[:, :-1], (1, 0)).detach()
    real = mask.bool()
    real[:, 0] = False

    values = state_values(critic, ids, mask)
    opening = critic_opening(critic, ids, mask)
    shared = state_values(critic, ids, mask, opening)
    torch.testing.assert_close(values[real], want[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[real], want[real], atol=1e-5, rtol=1e-5)
    assert opening.length == 20

    (values[real] ** 2).sum().backward()
    assert critic.head.weight.grad is not None and critic.head.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in policy.parameters())  # the policy's loss is its own
    opening.backward()  # no graph was kept: nothing to run, nothing reaches the policy
    assert all(p.grad is None for p in policy.parameters())


def test_the_policy_takes_the_copied_critics_step_and_only_the_head_is_saved(tmp_path):
    # Both critics start with a zero head, so a first step's values, advantages and policy
    # loss are the same: the policy's weights after it must be too.
    trained = {}
    for body in ("copy", "policy"):
        cfg = config.load("bandit", [*ONE_STEP, f"model.critic_body={body}"])
        run = create_run_dir(tmp_path / body, cfg)
        trainer = Trainer(cfg, run)
        head_before = trainer.m.critic.head.weight.detach().clone()
        policy_before = copy.deepcopy(trainer.m.policy.state_dict())
        trainer.train()
        trained[body] = (trainer, run)
        assert not torch.equal(trainer.m.critic.head.weight, head_before)  # the head trained
        after = trainer.m.policy.state_dict()
        assert any(not torch.equal(after[k], v) for k, v in policy_before.items())
    (copied, _), (trunk, run) = trained["copy"], trained["policy"]
    assert isinstance(trunk.m.critic, models.TrunkValueHead)
    assert trunk.m.critic.body is trunk.m.policy.get_decoder()
    mine, theirs = trunk.m.policy.state_dict(), copied.m.policy.state_dict()
    for key in theirs:
        torch.testing.assert_close(mine[key], theirs[key], atol=1e-6, rtol=1e-5)
    saved = load_file(checkpoint.complete_checkpoints(run)[-1] / "critic_trainable.safetensors")
    assert sorted(saved) == ["head.bias", "head.weight"]


def test_a_head_on_the_policy_cannot_be_cut_or_sharded():
    with pytest.raises(config.ConfigError, match=r"model\.critic_body and model\.critic_layers"):
        config.load("bandit", ["model.critic_body=policy", "model.critic_layers=2"])
    with pytest.raises(config.ConfigError, match=r"trainer\.parallel and model\.critic_body"):
        config.load("bandit", ["model.critic_body=policy", "trainer.parallel=fsdp"])


def test_a_resume_cannot_change_the_critics_body(tmp_path):
    cfg = config.load("bandit", [*ONE_STEP, "model.critic_body=policy"])
    run = create_run_dir(tmp_path / "run", cfg)
    asked = config.load("bandit", [*ONE_STEP, "model.critic_body=copy"])
    with pytest.raises(config.ConfigError, match=r"model\.critic_body=copy cannot apply"):
        check_resume(run, cfg, asked)


def test_with_lora_the_head_reads_the_adapted_decoder(tmp_path):
    cfg = config.load("bandit", [*ONE_STEP, "model.critic_body=policy", "model.lora_rank=4"])
    trainer = Trainer(cfg, create_run_dir(tmp_path / "run", cfg))
    body = trainer.m.critic.body
    assert any("lora_A" in name for name, _ in body.named_parameters())
    assert [n for n, _ in trainer.m.critic.named_parameters()] == ["head.weight", "head.bias"]
    head_before = trainer.m.critic.head.weight.detach().clone()
    trainer.train()
    assert not torch.equal(trainer.m.critic.head.weight, head_before)
