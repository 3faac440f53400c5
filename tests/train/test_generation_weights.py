"""The rollout samples from a copy of the master weights in model.dtype, which follows every
change of the master (an update, a rollback, a resumed checkpoint) before the next rollout."""

import copy

import torch

from ragen import config, models
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


def _lora_master(tiny):
    """The tiny model with rank-2 adapters on the attention's q and v projections, B set
    nonzero (peft starts it at 0, which would make the merge an identity)."""
    master = models.apply_lora(copy.deepcopy(tiny[0]), 2, 4, ["q_proj", "v_proj"])
    with torch.no_grad():
        for name, p in master.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.linspace(-0.5, 0.5, p.numel()).view_as(p))
    return master


def _want(master, name: str) -> torch.Tensor:
    """W + (alpha / r) B @ A of one adapted layer, computed by hand."""
    layer = master.get_submodule(f"base_model.model.{name}")
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    return layer.base_layer.weight + (4 / 2) * b @ a


def test_a_lora_master_is_copied_merged_and_follows_its_adapters(tiny):
    master = _lora_master(tiny)
    weights = GenerationWeights(master, torch.bfloat16)
    names = dict(weights.model.named_parameters())
    assert not any("lora" in name or "base_layer" in name for name in names)  # a plain model
    q = "model.layers.0.self_attn.q_proj"
    assert torch.equal(names[f"{q}.weight"], _want(master, q).to(torch.bfloat16))
    embed = master.get_base_model().model.embed_tokens.weight
    assert torch.equal(names["model.embed_tokens.weight"], embed.to(torch.bfloat16))
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        got = weights.model(ids).logits.float()
        want = master(ids).logits
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)  # bf16 rounding only

    with torch.no_grad():  # an optimiser step moves the adapters only
        for name, p in master.named_parameters():
            if "lora_" in name:
                p.mul_(-2.0)
    weights.refresh()
    v = "model.layers.1.self_attn.v_proj"
    assert torch.equal(names[f"{v}.weight"], _want(master, v).to(torch.bfloat16))
    assert torch.equal(names[f"{q}.weight"], _want(master, q).to(torch.bfloat16))
