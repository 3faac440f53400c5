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
from ragen.run.rundir import create_run_dir
from ragen.train import checkpoint
from ragen.train.forward import (
    SharedOpening,
    critic_opening,
    logprobs_and_trunk_values,
    state_values,
    token_logprobs,
)
from ragen.train.loop import RunLoop
from ragen.train.resume import check_resume
from ragen.train.scoring import score_batch
from ragen.train.trainer import Trainer


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
        trainer = Trainer(cfg)
        head_before = trainer.m.critic.head.weight.detach().clone()
        policy_before = copy.deepcopy(trainer.m.policy.state_dict())
        RunLoop(trainer, run).train()
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


def test_one_decoder_pass_gives_the_policys_logprobs_and_the_heads_values(tiny):
    policy = copy.deepcopy(tiny[0])
    critic = models.TrunkValueHead(policy)
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    ids, mask = _rows(policy.config.vocab_size)
    sampled = mask.clone()
    sampled[:, :22] = 0  # replies after a 22-token prompt
    sampled[2, 22:] = 0  # a row with nothing sampled

    for opening in (None, SharedOpening(policy.get_decoder(), ids, mask)):
        logp, ent, values = logprobs_and_trunk_values(
            policy, critic, ids, mask, sampled, temperature=0.7, opening=opening
        )
        want_logp, want_ent = token_logprobs(
            policy, ids, mask, sampled, temperature=0.7, opening=opening
        )
        assert torch.equal(logp, want_logp) and torch.equal(ent, want_ent)
        assert torch.equal(values, state_values(critic, ids, mask))
        assert values.requires_grad and logp.requires_grad
        # the values' graph reaches the head only; the log-probs' the policy
        (values[mask.bool()] ** 2).sum().backward()
        assert critic.head.weight.grad is not None
        assert all(p.grad is None for p in policy.parameters())
        logp.sum().backward()
        assert all(p.grad is not None for p in policy.get_decoder().layers.parameters())
        policy.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)

    def scored(policy, critic):
        with torch.no_grad():
            return score_batch(
                policy,
                critic,
                None,
                ids,
                mask,
                sampled,
                temperature=0.7,
                micro_batch=2,
                share_opening=True,
            )

    both, alone, values = scored(policy, critic), scored(policy, None), scored(None, critic)
    assert torch.equal(both["old_logprobs"], alone["old_logprobs"])
    torch.testing.assert_close(both["values"], values["values"], atol=1e-6, rtol=1e-6)


def test_a_scored_step_runs_the_policys_decoder_once_a_micro_batch_for_both(tmp_path):
    # Scored first, as an update that is not exactly on-policy is: the head's values come from
    # the policy's passes, and the step equals the copied critic's (both heads zero: the same
    # advantages; the same hidden states, so the same head gradient).
    trained, passes = {}, {}
    for body in ("copy", "policy"):
        cfg = config.load("bandit", [*ONE_STEP, f"model.critic_body={body}"])
        trainer = Trainer(cfg)
        trainer.on_policy = lambda kept: False  # type: ignore[method-assign]
        calls = []
        trainer.m.policy.get_decoder().register_forward_hook(lambda *_, c=calls: c.append(1))
        RunLoop(trainer, create_run_dir(tmp_path / body, cfg)).train()
        trained[body], passes[body] = trainer, len(calls)
    copied, trunk = trained["copy"].m, trained["policy"].m
    for key, value in copied.policy.state_dict().items():
        torch.testing.assert_close(trunk.policy.state_dict()[key], value, atol=1e-6, rtol=1e-5)
    for key, value in copied.critic.head.state_dict().items():
        torch.testing.assert_close(trunk.critic.head.state_dict()[key], value, atol=1e-6, rtol=1e-5)
    assert passes["policy"] == passes["copy"]  # no decoder pass of the policy's for the head


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
    trainer = Trainer(cfg)
    body = trainer.m.critic.body
    assert any("lora_A" in name for name, _ in body.named_parameters())
    assert [n for n, _ in trainer.m.critic.named_parameters()] == ["head.weight", "head.bias"]
    head_before = trainer.m.critic.head.weight.detach().clone()
    RunLoop(trainer, create_run_dir(tmp_path / "run", cfg)).train()
    assert not torch.equal(trainer.m.critic.head.weight, head_before)
