"""The rollout samples from a copy of the master weights in model.dtype, which follows every
change of the master (an update, a rollback, a resumed checkpoint) before the next rollout."""

import copy

import torch

from ragen import config
from ragen.rollout.engines.base import weights_version
from ragen.train.generation_weights import GenerationWeights
from ragen.train.trainer import Trainer


def _bumped(model: torch.nn.Module) -> None:
    """Change every weight in place, as an optimiser step does."""
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.01 * (i + 1))


def _equal_to_cast(copy_, master, dtype) -> bool:
    pairs = zip(copy_.parameters(), master.parameters(), strict=True)
    return all(torch.equal(mine, theirs.to(dtype)) for mine, theirs in pairs)


def test_a_copy_in_bf16_follows_every_change_of_the_master(tiny):
    master = copy.deepcopy(tiny[0])
    weights = GenerationWeights(master, torch.bfloat16)
    assert weights.copied
    assert all(p.dtype == torch.bfloat16 for p in weights.model.parameters())
    assert not any(p.requires_grad for p in weights.model.parameters())
    # buffers (rotary frequencies) keep their dtype: only the weights are cast
    buffers = zip(weights.model.buffers(), master.buffers(), strict=True)
    assert all(mine.dtype == theirs.dtype for mine, theirs in buffers)
    assert _equal_to_cast(weights.model, master, torch.bfloat16)

    _bumped(master)
    assert not _equal_to_cast(weights.model, master, torch.bfloat16)
    weights.refresh()
    assert _equal_to_cast(weights.model, master, torch.bfloat16)
    version = weights_version(weights.model)
    weights.refresh()  # nothing changed since: nothing copied
    assert weights_version(weights.model) == version


def test_float32_samples_with_the_master_itself(tiny):
    master = copy.deepcopy(tiny[0])
    weights = GenerationWeights(master, torch.float32)
    assert weights.model is master and not weights.copied
    weights.refresh()


def test_the_trainer_rolls_out_with_the_copy_refreshed_after_the_weights_change():
    cfg = config.load(
        "bandit",
        [
            "model.spec=tiny",
            "model.dtype=bfloat16",
            "rollout.groups=2",
            "rollout.group_size=2",
            "rollout.max_reply_tokens=8",
            "trainer.mini_batch_size=2",
            "trainer.micro_batch_size=2",
            "trainer.eval_every=0",
            "logging.progress=false",
            "logging.tensorboard=false",
        ],
    )
    trainer = Trainer(cfg)
    sampler = trainer.sampler.model
    assert trainer.generator.model is sampler  # type: ignore[attr-defined]
    assert next(sampler.parameters()).dtype == torch.bfloat16
    assert next(trainer.m.policy.parameters()).dtype == torch.float32  # what the update trains

    _bumped(trainer.m.policy)
    trainer.collect(0)
    assert _equal_to_cast(sampler, trainer.m.policy, torch.bfloat16)

    # with float32 the rollout samples with the master weights themselves
    plain = Trainer(config.load("bandit", ["model.spec=tiny", "model.dtype=float32"]))
    assert plain.generator.model is plain.m.policy  # type: ignore[attr-defined]
