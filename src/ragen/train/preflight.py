"""Checks that a run can start, made before anything is written: the device exists, the
model's folder, config and chat template are intact, the LoRA targets and rank fit the model,
and the estimator can be imported.

Nothing here reads weights: the model is built on the ``meta`` device (every module and
shape, no storage), so a 0.5B model costs about what the tiny one does.
"""

from __future__ import annotations

import torch

from ragen import envs, models
from ragen.config import (
    Config,
    ConfigError,
    ModelConfig,
    env_options,
    import_estimator,
    is_device,
)

ALL_LINEAR = "all-linear"


def check_runnable(config: Config) -> None:
    """Raise ConfigError (or ModelError) with one line if ``config`` cannot train here."""
    check_device(config.trainer.device)
    check_demonstrations(config, [config.env.name, *config.env.eval_names])
    import_estimator(config)  # user code, imported only now that a run starts
    m = config.model
    skeleton = models.build_skeleton(
        m.spec, allow_download=m.allow_download, trust_remote_code=m.trust_remote_code
    )
    # loading the tokenizer renders its chat template once, under the template time bound
    models.load_tokenizer(
        m.spec, allow_download=m.allow_download, trust_remote_code=m.trust_remote_code
    )
    if m.lora_rank > 0:
        check_lora(skeleton, m)


def check_demonstrations(config: Config, env_names: list[str]) -> None:
    """The worked turns ``rollout.demos`` asks for can be built for every env in
    ``env_names`` under its options (Sokoban solves its worked rooms: a room size or
    box count past the solver's bound has none). The config's own check counted them."""
    if not config.rollout.demos:
        return
    for name in dict.fromkeys(env_names):
        options = env_options(config, name)
        try:
            envs.demonstrations(envs.make(name, **options))
        except envs.GenerationError as err:
            message = f"config: rollout.demos={config.rollout.demos} on {name}: {err}"
            raise ConfigError(message) from None


def check_device(name: str) -> None:
    """``trainer.device`` names a device this machine has (``auto`` always does)."""
    if not is_device(name):  # the schema's rule, for a name that did not come through it
        raise ConfigError(
            f"config: trainer.device={name!r} is not a device: use auto, cpu, cuda or cuda:N"
        )
    if name in ("auto", "cpu"):
        return
    if not torch.cuda.is_available():
        raise ConfigError(
            f"config: trainer.device={name!r}, but PyTorch sees no CUDA GPU on this machine: "
            "use trainer.device=cpu (or auto), or a CUDA build of PyTorch on a GPU machine"
        )
    count = torch.cuda.device_count()
    index = torch.device(name).index
    if index is not None and index >= count:
        raise ConfigError(
            f"config: trainer.device={name!r}, but this machine has {count} GPU(s): "
            f"use cuda:0 to cuda:{count - 1}"
        )


def _adaptable(skeleton) -> dict[str, torch.nn.Module]:
    """The modules LoRA can adapt (linear and embedding layers), by their full name."""
    from transformers.pytorch_utils import Conv1D

    kinds = (torch.nn.Linear, torch.nn.Embedding, Conv1D)
    return {name: mod for name, mod in skeleton.named_modules() if isinstance(mod, kinds)}


def _check_targets(skeleton, m: ModelConfig) -> None:
    """Every name in ``model.lora_targets`` matches a layer, as peft matches it (a full name
    or a dotted suffix of one)."""
    if not m.lora_targets:
        raise ConfigError(
            "config: model.lora_targets is empty: name the layers LoRA adapts, e.g. "
            f"[q_proj, v_proj], or use [{ALL_LINEAR}]"
        )
    if list(m.lora_targets) == [ALL_LINEAR]:
        return
    names = list(_adaptable(skeleton))
    for target in m.lora_targets:
        if not any(name == target or name.endswith(f".{target}") for name in names):
            known = sorted({name.rsplit(".", 1)[-1] for name in names})
            raise ConfigError(
                f"config: model.lora_targets names {target!r}, which is no linear or embedding "
                f"layer of {m.spec}: use some of {', '.join(known)}, or [{ALL_LINEAR}]"
            )


def _narrowest(layer) -> int:
    """The smaller of a LoRA-wrapped layer's input and output sizes."""
    return min(layer.in_features, layer.out_features)


def check_lora(skeleton, m: ModelConfig) -> None:
    """LoRA targets name layers of the model, and the rank fits every targeted layer: an
    update ``B @ A`` of a (out × in) layer has rank at most min(in, out), so a larger rank
    only adds memory (and a huge one exhausts it)."""
    from peft.tuners.lora import LoraLayer

    _check_targets(skeleton, m)
    # Rank 1 on the meta device: peft picks the same layers as the run's rank would.
    try:
        adapted = models.apply_lora(skeleton, 1, m.lora_alpha, m.lora_targets)
    except ValueError as err:
        first = str(err).strip().splitlines()[0]
        raise ConfigError(f"config: model.lora_targets={m.lora_targets}: {first}") from None
    layers = {n: mod for n, mod in adapted.named_modules() if isinstance(mod, LoraLayer)}
    name, layer = min(layers.items(), key=lambda item: _narrowest(item[1]))
    limit = _narrowest(layer)
    if m.lora_rank > limit:
        short = name.removeprefix("base_model.model.")
        raise ConfigError(
            f"config: model.lora_rank={m.lora_rank} is above {limit}, the smallest dimension of "
            f"the layers it adapts in {m.spec} ({short}: {layer.in_features} -> "
            f"{layer.out_features}): use model.lora_rank<={limit}"
        )
