"""What a training process builds before its first step: the device, the models and their
optimisers, the frozen reference, and the weights and engine the rollout samples with.

Nothing here touches a run directory: building is all it does. The RL step (trainer.py)
and the SFT step (sft.py) each build their own models from here; the run loop (loop.py)
drives either.
"""

from __future__ import annotations

import copy
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ragen import models
from ragen.config import Config
from ragen.rollout.engines import Generator, make_generator
from ragen.train import distributed, fsdp, preflight
from ragen.train.generation_weights import COPYING_BACKENDS, GenerationWeights
from ragen.train.scoring import policy_logprobs


def resolve_device(name: str) -> torch.device:
    """``trainer.device`` as a device; ``auto`` is CUDA when there is one. Under torchrun
    each process takes the GPU of its ``LOCAL_RANK``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = distributed.local_device(torch.device(name))
    if device.type == "cuda" and device.index is not None:
        # the current device is what torch.cuda.synchronize (phase timings) and new
        # allocations without a device use: cuda:N, not GPU 0
        torch.cuda.set_device(device)
    return device


def use_deterministic_kernels(device: torch.device, on: bool) -> None:
    """Make the CUDA kernels of this process deterministic, or leave torch's default."""
    if device.type != "cuda":
        return
    if on:  # cuBLAS reads it when it makes its first handle; torch checks it on every matmul
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: an op without a deterministic kernel warns and runs rather than end the run
    torch.use_deterministic_algorithms(on, warn_only=True)


def start(config: Config) -> torch.device:
    """Ready this process for a run of ``config``: its names checked (what `ragen train`
    checks as it loads a config, so a library caller is refused alike), its device,
    deterministic kernels if asked, and torch's seed (which fixes whatever the model load
    initialises)."""
    preflight.check_references(config)
    device = resolve_device(config.trainer.device)
    use_deterministic_kernels(device, config.trainer.deterministic)
    torch.manual_seed(config.trainer.seed)
    if config.trainer.parallel == "fsdp" and distributed.world_size() == 1:
        distributed.say("trainer.parallel=fsdp has no effect in one process: nothing to shard over")
    return device


@dataclass
class Models:
    """What the loop trains and samples with."""

    policy: torch.nn.Module
    tokenizer: Any  # a transformers tokenizer (PreTrainedTokenizerBase), used duck-typed
    critic: torch.nn.Module | None
    ref: object  # callable (ids, mask, loss_mask) -> (B, T) log-probs; None when KL is off
    optimizers: dict[str, torch.optim.Optimizer]
    ref_model: torch.nn.Module | None = None  # the reference's own copy, if it has one

    def scorers(self) -> tuple[torch.nn.Module | None, ...]:
        """The models a scoring pass runs: policy, critic, reference copy (None if absent)."""
        return self.policy, self.critic, self.ref_model


def sharded(config: Config) -> bool:
    """Whether this run shards its models: trainer.parallel=fsdp over several processes."""
    return config.trainer.parallel == "fsdp" and distributed.world_size() > 1


def build_models(config: Config, device: torch.device) -> Models:
    """Policy (float32 master weights, LoRA if asked), critic from the same LM, optimisers;
    each model sharded (before its optimiser takes its parameters) if the run shards."""
    m, t, a = config.model, config.trainer, config.algo
    policy, tokenizer = load_master_policy(config, device)
    copied = None
    if a.trains_critic() and m.critic_body == "copy":
        copied = models.ValueModel(copy.deepcopy(policy), m.critic_layers).to(device)
    if m.lora_rank > 0:
        policy = models.apply_lora(policy, m.lora_rank, m.lora_alpha, m.lora_targets)
        if copied is not None:
            copied.body = models.apply_lora(copied.body, m.lora_rank, m.lora_alpha, m.lora_targets)
    critic: models.ValueModel | models.TrunkValueHead | None = copied
    if a.trains_critic() and m.critic_body == "policy":
        critic = models.TrunkValueHead(policy).to(device)  # on the decoder LoRA adapts, if any
    ref, ref_model = reference(policy, a.kl_coef, config.rollout.temperature)
    if sharded(config):
        for model in (policy, critic, ref_model):
            if model is not None:
                fsdp.shard(model)
    optimizers: dict[str, torch.optim.Optimizer] = {"actor": adamw(policy, t.actor_lr, config)}
    if critic is not None:
        optimizers["critic"] = adamw(critic, t.critic_lr, config)
    return Models(policy.eval(), tokenizer, critic, ref, optimizers, ref_model)


def build_policy(config: Config, device: torch.device, lr: float) -> Models:
    """The policy alone (LoRA if asked) with its AdamW at ``lr``: what a supervised step
    trains; no critic, no reference."""
    m = config.model
    policy, tokenizer = load_master_policy(config, device)
    if m.lora_rank > 0:
        policy = models.apply_lora(policy, m.lora_rank, m.lora_alpha, m.lora_targets)
    return Models(policy.eval(), tokenizer, None, None, {"actor": adamw(policy, lr, config)})


def load_master_policy(config: Config, device: torch.device):
    """(policy, tokenizer) of ``model.spec`` in float32 master weights on ``device``, before
    any LoRA; the trainer's seed fixes whatever the load initialises."""
    m = config.model
    return models.load_policy(
        m.spec,
        dtype="float32",
        device=str(device),
        allow_download=m.allow_download,
        seed=config.trainer.seed,
        trust_remote_code=m.trust_remote_code,
    )


def adamw(model: torch.nn.Module, lr: float, config: Config) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, with the trainer's betas and weight decay."""
    t = config.trainer
    params = [p for p in model.parameters() if p.requires_grad]
    betas = (t.adam_beta1, t.adam_beta2)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=t.weight_decay)


def reference(policy, kl_coef: float, temperature: float):
    """The frozen reference policy for the KL term and its own copy of the model: (None, None)
    when the term is off. With LoRA the reference is the policy with its adapters switched
    off: no second copy (None)."""
    if kl_coef <= 0:
        return None, None
    if hasattr(policy, "disable_adapter"):
        model, context = policy, policy.disable_adapter
    else:
        model, context = copy.deepcopy(policy).requires_grad_(False), nullcontext

    def ref_logprobs(ids, mask, sampled):
        with context():
            return policy_logprobs(
                model, ids, mask, sampled, temperature=temperature, with_entropy=False
            )[0]

    return ref_logprobs, None if model is policy else model


def sampling(
    config: Config, m: Models, device: torch.device
) -> tuple[GenerationWeights, Generator]:
    """The weights the rollout samples with (the master policy, or its copy in model.dtype)
    and the ``rollout.backend`` engine over them."""
    sampler = GenerationWeights(m.policy, generation_dtype(config, m.policy, device))
    generator = make_generator(
        config.rollout.backend, sampler.model, m.tokenizer, attention=config.model.attention
    )
    return sampler, generator


def generation_dtype(config: Config, policy: torch.nn.Module, device: torch.device) -> torch.dtype:
    """What the rollout samples in: model.dtype, for the backends that sample with the
    trainer's own model and when it is not sharded (the vLLM engines pick their own; a
    sharded policy's weights are gathered for each rollout instead)."""
    if config.rollout.backend not in COPYING_BACKENDS or fsdp.is_sharded(policy):
        return next(policy.parameters()).dtype
    return models.resolve_dtype(config.model.dtype, device)


def update_dtype(config: Config, device: torch.device) -> torch.dtype | None:
    """What the update's forwards autocast to (trainer.update_dtype); None: float32, the
    master weights' own dtype, so no autocast."""
    dtype = models.resolve_dtype(config.trainer.update_dtype, device)
    return None if dtype == torch.float32 else dtype


def autocast(device: torch.device, dtype: torch.dtype | None):
    """A context running forwards under autocast to ``dtype``; no context for None."""
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)
