"""Checks of a config beyond what its schema can judge, made before anything is written.

- :func:`check_references`: the names a config points to outside itself (the model spec, the
  environments with the options and worked turns of ragen's own, reward terms, the
  estimator, wandb), judged without running user code; every command that takes a config
  (`ragen config show`, `train`, `sft`, `eval`, a study's plan) runs it after loading one.
- :func:`import_envs`, :func:`import_reward_terms`, :func:`import_estimator`: the user code a
  config names, imported only when a run starts and before it writes anything.
- :func:`check_runnable`: the device exists, the model's folder, config and chat template are
  intact, the LoRA targets and rank fit the model.
- :func:`check_start`: all that, when `ragen train` or `ragen sft` starts a run; and
  :func:`check_expert` for the runs that imitate the env's expert.

Nothing here reads weights: the model is built on the ``meta`` device (every module and
shape, no storage), so a 0.5B model costs about what the tiny one does.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from ragen import envs, models
from ragen.algos import advantages
from ragen.config import Config, ConfigError, ModelConfig, env_options, is_device
from ragen.config.errors import reason, shown
from ragen.envs.experts import PUSH_EXPERTS, SIDES_EXPERTS, has_expert
from ragen.envs.frozen_lake import FrozenLakeEnv
from ragen.envs.sokoban import SokobanEnv
from ragen.rollout import rewards
from ragen.train import distributed

ALL_LINEAR = "all-linear"


# ------------------------------------------------------------------ names outside the config


def check_references(c: Config) -> Config:
    """Raise ConfigError unless every name ``c`` points to outside itself resolves: the
    estimator, the model spec, the environments, the reward terms, and wandb when asked for.
    A name of the user's (package.module:function or :Class) is judged by its shape only:
    importing it would run user code, which the ``import_*`` functions do when a run starts.
    Returns ``c`` unchanged."""
    _judge_estimator(c, advantages.check_name)
    try:
        source = models.resolve(c.model.spec)
    except (models.ModelError, OSError) as err:  # OSError: a name the file system refuses
        raise ConfigError(f"config: model.spec={shown(c.model.spec)}: {reason(err)}") from None
    if source.kind == "hub" and not c.model.allow_download:
        raise ConfigError(
            f"config: model.spec={shown(c.model.spec)} is a Hub id but model.allow_download="
            "false: pass a local folder or set model.allow_download=true"
        )
    _check_envs(c)
    _judge_reward_terms(c, rewards.check_name)
    if c.logging.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "config: logging.wandb=true but wandb is not installed: "
            "`pip install wandb`, or set logging.wandb=false"
        )
    return c


def import_estimator(c: Config) -> None:
    """Import a module:function ``algo.estimator``: user code, so call this only when a run
    starts (as :func:`import_reward_terms`), before the run writes anything, so that one that
    cannot be imported leaves nothing behind."""
    _judge_estimator(c, advantages.resolve)


def _judge_estimator(c: Config, judge: Callable[[str], object]) -> None:
    """Run ``judge`` on algo.estimator; its ValueError, which names the value, becomes a
    one-line ConfigError."""
    try:
        judge(c.algo.estimator)
    except ValueError as err:
        raise ConfigError(f"config: algo.estimator: {reason(err)}") from None


def import_reward_terms(c: Config) -> None:
    """Import every module:function term of ``c``: user code, so call this only when a run
    starts, from a config the user passed (never to check or show one), and before the run
    writes anything, so that a term that cannot be imported leaves nothing behind."""
    _judge_reward_terms(c, rewards.resolve)


def _judge_reward_terms(c: Config, judge: Callable[[str], object]) -> None:
    """Run ``judge`` on each term's name; its ValueError becomes a one-line ConfigError."""
    for name in c.rollout.reward_terms:
        try:
            judge(name)
        except ValueError as err:
            raise ConfigError(f"config: rollout.reward_terms: {reason(err)}") from None


def _env_names(c: Config) -> list[tuple[str, str]]:
    """(key, name) of each environment ``c`` names: the training env, then the eval ones."""
    return [("env.name", c.env.name)] + [
        (f"env.eval_names[{i}]", n) for i, n in enumerate(c.env.eval_names)
    ]


def _check_envs(c: Config) -> None:
    """Each env's name; and the options and worked turns of those ragen ships. An env of
    the user's (package.module:Class, or an installed entry point) is judged by its name
    only: building it would run its code, which :func:`import_envs` does when a run starts."""
    for key, name in _env_names(c):
        try:
            envs.check_name(name)
        except ValueError as err:
            raise ConfigError(f"config: {key}={shown(name)}: {reason(err)}") from None
    _check_built_envs(c, [name for _, name in _env_names(c) if name in envs.names()])


def import_envs(c: Config) -> None:
    """Import every env of ``c`` from outside ragen, and check its options and worked turns
    as :func:`check_references` does for ragen's envs: user code, so call this only when a
    run starts (as :func:`import_reward_terms`), before anything builds those envs."""
    user = [(key, name) for key, name in _env_names(c) if name not in envs.names()]
    for key, name in user:
        try:
            envs.spec(name)
        except ValueError as err:
            raise ConfigError(f"config: {key}={shown(name)}: {reason(err)}") from None
    _check_built_envs(c, [name for _, name in user])


def _check_built_envs(c: Config, names: list[str]) -> None:
    """Build the envs ``names`` picks out of ``c``'s: each env given options (env.options,
    env.eval_options) must make a level under them, and each must offer the worked turns
    rollout.demos asks for."""
    built = {}
    for name in dict.fromkeys(names):
        options = env_options(c, name)
        if not options and name != c.env.name:
            continue
        key = "env.options" if name == c.env.name else f"env.eval_options.{name}"
        try:
            built[name] = envs.make(name, **options)
            built[name].reset(0)  # options that make no level fail here, not mid-run
        except (TypeError, ValueError, envs.GenerationError) as err:
            raise ConfigError(f"config: {key}={shown(options)}: {reason(err)}") from None
    if not c.rollout.demos:
        return
    # Counted, not built: building plays (for Sokoban: solves) levels, which
    # check_demonstrations does when a run starts.
    for name in dict.fromkeys(names):
        offered = envs.demo_count(built[name] if name in built else envs.make(name))
        if c.rollout.demos > offered:
            raise ConfigError(
                f"config: rollout.demos={c.rollout.demos} but {name} offers {offered} "
                f"demonstrations: set rollout.demos to at most {offered}"
            )


# ------------------------------------------------------------------------- a run can start


def check_start(c: Config) -> None:
    """What a run checks before it makes its folder: the user code ``c`` names, imported
    only now that a run starts, and whether it can train here (one line if not)."""
    import_envs(c)
    check_runnable(c)  # builds the worked turns of the envs just imported
    import_reward_terms(c)
    distributed.check_split(c.rollout.groups)  # torchrun: every process refuses, at once


def check_expert(c: Config, head: str = "", fix: str = "") -> None:
    """Refuse, in one line (``head`` first, ``fix`` last), an env with no expert to imitate;
    an env of the user's is imported here."""
    import_envs(c)
    env = envs.make(c.env.name, **c.env.options)
    if not has_expert(env):
        raise ConfigError(
            f"{head}{c.env.name} has no expert to imitate: ragen sft plays ragen's games and "
            "any env with an expert(limit, located) method "
            f"(docs/guides/adding-an-environment.md){fix}"
        )
    slips = c.sft.lake_expert in SIDES_EXPERTS
    if slips and isinstance(env, FrozenLakeEnv) and not env.slippery:
        raise ConfigError(
            f"{head}sft.lake_expert={c.sft.lake_expert} reasons about slips, and this lake is "
            "not slippery: set sft.lake_expert=careful or env.options.slippery=true"
        )
    push = c.sft.sokoban_expert in PUSH_EXPERTS
    if push and isinstance(env, SokobanEnv) and env.num_boxes != 1:
        raise ConfigError(
            f"{head}sft.sokoban_expert={c.sft.sokoban_expert} plays rooms of one box, and "
            f"env.options.num_boxes={env.num_boxes}: set env.options.num_boxes=1 or "
            "sft.sokoban_expert=optimal"
        )


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
    box count past the solver's bound has none). :func:`check_references` counted them."""
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
    if not is_device(name):  # the config's rule, for a name that did not come through it
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
    # transformers and peft load here, not at the top: `ragen config show` and a study's plan
    # import this module for check_references and never build a model.
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
    from peft.tuners.lora import LoraLayer  # lazily, as in _adaptable

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
