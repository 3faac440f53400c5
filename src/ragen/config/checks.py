"""Settings that are each valid but cannot work together, judged from the schema alone.

Names that point outside the config (the model, the environments, reward terms, the
estimator) are judged where a run is set up, by :mod:`ragen.train.preflight`.
"""

from __future__ import annotations

import math
import re

from ragen.config.build import check_ranges
from ragen.config.errors import ConfigError, shown
from ragen.config.schema import (
    ESTIMATOR_NAMES,
    FILTER_VALUE_KEYS,
    MAX_EPISODES_PER_STEP,
    MAX_EVAL_EPISODES,
    MIN_TEMPERATURE,
    NEEDS_CRITIC,
    NEEDS_GROUPS,
    OLD_FILTER_MODES,
    AlgoConfig,
    Config,
)

_MAX_CUDA_INDEX = 127  # torch keeps a device index in 8 bits: cuda:128 becomes cuda:-128


def validate(c: Config) -> Config:
    """Raise ConfigError unless ``c``'s values lie in their ranges and work together; return
    it unchanged."""
    check_ranges(c)
    check_combinations(c)
    return c


def _contradiction(keys: str, values: str, fix: str) -> ConfigError:
    return ConfigError(f"config: {keys} contradict ({values}): {fix}")


def check_combinations(c: Config) -> Config:
    """Raise ConfigError if settings of ``c`` that are each valid cannot work together;
    return it unchanged."""
    r, a, t = c.rollout, c.algo, c.trainer
    if r.groups * r.group_size > MAX_EPISODES_PER_STEP:
        raise _contradiction(
            "rollout.groups and rollout.group_size",
            f"{r.groups} × {r.group_size} > {MAX_EPISODES_PER_STEP} episodes per step",
            "lower one of them",
        )
    if t.eval_episodes * t.eval_k > MAX_EVAL_EPISODES:
        raise _contradiction(
            "trainer.eval_episodes and trainer.eval_k",
            f"{t.eval_episodes} × {t.eval_k} > {MAX_EVAL_EPISODES} episodes per evaluation",
            "lower one of them",
        )
    if r.max_actions_per_turn > r.max_actions_per_episode:
        raise _contradiction(
            "rollout.max_actions_per_turn and rollout.max_actions_per_episode",
            f"{r.max_actions_per_turn} > {r.max_actions_per_episode}",
            "a turn can never use more actions than the episode has; lower the first",
        )
    if r.max_reply_tokens >= r.max_context_tokens:
        raise _contradiction(
            "rollout.max_reply_tokens and rollout.max_context_tokens",
            f"{r.max_reply_tokens} >= {r.max_context_tokens}",
            "one reply must fit in the context with the prompt; raise max_context_tokens",
        )
    if r.context_window == "full" and r.context_turns != 1:
        raise _contradiction(
            "rollout.context_window and rollout.context_turns",
            f"full with context_turns={r.context_turns}",
            "the full window shows every turn; set rollout.context_window=limited_multi_turn "
            "or single_turn, or leave context_turns at 1",
        )
    _check_estimator(c)
    _check_filter(c)
    kept = kept_episodes(c)
    if t.mini_batch_size > kept:
        rule = _KEPT_RULES.get(a.filter_choice()[0], "groups")
        raise _contradiction(
            "trainer.mini_batch_size and the episodes kept per step",
            f"{t.mini_batch_size} > {kept} = {rule} × group_size",
            "lower trainer.mini_batch_size or keep more groups",
        )
    if t.micro_batch_size > t.mini_batch_size and r.context_window == "full":
        raise _contradiction(
            "trainer.micro_batch_size and trainer.mini_batch_size",
            f"{t.micro_batch_size} > {t.mini_batch_size}",
            "a micro-batch is a slice of a mini-batch's episodes; lower trainer.micro_batch_size",
        )
    if r.reuse_k > 1 and t.save_every % r.reuse_k:
        raise _contradiction(
            "trainer.save_every and rollout.reuse_k",
            f"{t.save_every} is not a multiple of {r.reuse_k}",
            "a checkpoint inside a reuse window could not resume exactly; make save_every "
            "a multiple of reuse_k",
        )
    if c.model.critic_body == "policy" and c.model.critic_layers is not None:
        raise _contradiction(
            "model.critic_body and model.critic_layers",
            f"critic_body=policy with critic_layers={c.model.critic_layers}",
            "a head on the policy's trunk reads all of its layers; leave critic_layers null, "
            "or use critic_body=copy to cut a copy",
        )
    if c.sft.warm_start and 0 < t.max_minutes <= c.sft.warm_start_minutes:
        raise _contradiction(
            "sft.warm_start_minutes and trainer.max_minutes",
            f"{c.sft.warm_start_minutes:g} >= {t.max_minutes:g}",
            "the warm start would leave RL no time; lower sft.warm_start_minutes, or set "
            "sft.warm_start=false",
        )
    _check_monitor(c)
    _check_fsdp(c)
    if not is_device(t.device):
        raise ConfigError(
            f"config: trainer.device={shown(t.device)} is not allowed: must be auto, cpu, cuda "
            f"or cuda:N with N from 0 to {_MAX_CUDA_INDEX}"
        )
    _check_eval_options(c)
    check_temperature("rollout.temperature", r.temperature)
    check_temperature("trainer.eval_temperature", t.eval_temperature)
    return c


def temperature_problem(value: float) -> str | None:
    """Why ``value`` cannot be a sampling temperature (above 0 but under MIN_TEMPERATURE),
    or None; the config and `ragen eval --temperature` refuse it alike."""
    if 0 < value < MIN_TEMPERATURE:
        return (
            f"is below {MIN_TEMPERATURE:g}, where the scaled logits overflow: use 0 for "
            "greedy decoding, or at least that"
        )
    return None


def check_temperature(key: str, value: float) -> None:
    """Refuse a sampling temperature ``temperature_problem`` finds a problem in."""
    problem = temperature_problem(value)
    if problem is not None:
        raise ConfigError(f"config: {key}={value:g} {problem}")


def _check_monitor(c: Config) -> None:
    """Refuse monitor settings that could never act as written."""
    mon, t = c.monitor, c.trainer
    stops = [
        f"{key}={value}"
        for key, value in (
            ("variance_collapse_steps", mon.variance_collapse_steps),
            ("eval_floor_evals", mon.eval_floor_evals),
        )
        if value
    ]
    if not mon.enabled and (stops or mon.action != "warn"):
        raise _contradiction(
            "monitor.enabled and the monitor's stops and action",
            ", ".join(["enabled=false", *stops, f"action={mon.action}"]),
            "with the detector off nothing is called or acted on; set monitor.enabled=true, "
            "or leave the early stops at 0 and monitor.action=warn",
        )
    if mon.eval_floor_evals and not t.eval_every:
        raise _contradiction(
            "monitor.eval_floor_evals and trainer.eval_every",
            f"{mon.eval_floor_evals} with eval_every=0",
            "the evaluation-floor stop counts evaluations and none is made; set "
            "trainer.eval_every, or monitor.eval_floor_evals=0",
        )
    if mon.act_on == "early_stop" and not stops:
        raise _contradiction(
            "monitor.act_on and the early stops",
            "act_on=early_stop with variance_collapse_steps=0 and eval_floor_evals=0",
            "switch one of RAGEN-2's stops on, or act on collapse",
        )
    if mon.action == "rollback" and not (
        t.eval_every and t.save_every and t.save_every % t.eval_every == 0
    ):
        raise _contradiction(
            "monitor.action=rollback and trainer.eval_every / trainer.save_every",
            f"eval_every={t.eval_every}, save_every={t.save_every}",
            "a rollback loads the checkpoint whose own evaluation was best, so every "
            "checkpoint must be evaluated: make trainer.save_every a multiple of a nonzero "
            "trainer.eval_every, or use monitor.action=stop",
        )


def is_device(name: str) -> bool:
    """Whether ``name`` is a device torch reads as written (auto, cpu, cuda, cuda:N)."""
    kind, sep, index = name.partition(":")
    if not sep:
        return name in ("auto", "cpu", "cuda")
    number = re.fullmatch(r"0|[1-9][0-9]{0,2}", index)
    return kind == "cuda" and number is not None and int(index) <= _MAX_CUDA_INDEX


def _check_fsdp(c: Config) -> None:
    """What trainer.parallel=fsdp cannot run with."""
    if c.trainer.parallel != "fsdp":
        return
    if c.model.lora_rank > 0:
        raise _contradiction(
            "trainer.parallel and model.lora_rank",
            f"fsdp with lora_rank={c.model.lora_rank}",
            "a checkpoint merges the adapters into a copy of the model, which FSDP2 cannot "
            "make; LoRA keeps gradients and optimiser states small anyway: use "
            "trainer.parallel=ddp with LoRA, or model.lora_rank=0",
        )
    if c.model.critic_body == "policy":
        raise _contradiction(
            "trainer.parallel and model.critic_body",
            "fsdp with critic_body=policy",
            "the head's values would need a forward of the sharded policy that the ranks do "
            "not run in step; use trainer.parallel=ddp, or model.critic_body=copy",
        )
    if c.rollout.backend != "hf":
        raise _contradiction(
            "trainer.parallel and rollout.backend",
            f"fsdp with {c.rollout.backend}",
            "the naive backend's model.generate waits at every token for the other processes "
            "once the model is sharded, and vLLM engines read whole weights from the model; "
            "use rollout.backend=hf",
        )


def _check_estimator(c: Config) -> None:
    """The critic and group size ragen's estimators need. The estimator's name is judged by
    :func:`ragen.train.preflight.check_references`; a module:function estimator gets a critic
    when algo.critic=true, and the group size it needs is the user's to set."""
    a, r = c.algo, c.rollout
    needs = a.estimator in NEEDS_CRITIC
    if a.estimator in ESTIMATOR_NAMES and a.critic is not None and a.critic != needs:
        raise _contradiction(
            "algo.critic and algo.estimator",
            f"{shown(a.critic)} with {a.estimator}",
            f"{a.estimator} {'reads' if needs else 'reads no'} critic values; set algo.critic="
            "null, which follows the estimator",
        )
    if a.estimator == "gigpo" and r.reward_placement != "per_turn":
        raise _contradiction(
            "algo.estimator and rollout.reward_placement",
            f"gigpo with reward_placement={r.reward_placement}",
            "gigpo compares the discounted return of each turn from its own reward; set "
            "rollout.reward_placement=per_turn",
        )
    if a.dr_grpo:
        _check_dr_grpo(a)
    if a.estimator in NEEDS_GROUPS and r.group_size < 2:
        raise _contradiction(
            "algo.estimator and rollout.group_size",
            f"{a.estimator} with group_size={r.group_size}",
            f"{a.estimator} compares rollouts of one group; set rollout.group_size >= 2",
        )


def _check_dr_grpo(a: AlgoConfig) -> None:
    """algo.dr_grpo=true against the estimator and the two keys it stands for."""
    if a.estimator != "grpo":
        raise _contradiction(
            "algo.dr_grpo and algo.estimator",
            f"true with {a.estimator}",
            "Dr. GRPO is grpo without the std division; use algo.estimator=grpo, or set "
            "algo.dr_grpo=false",
        )
    implied = {"grpo_norm_by_std": (False, "false"), "loss_agg": ("seq_mean_token_sum",) * 2}
    for key, (value, spelled) in implied.items():
        if getattr(a, key) not in (None, value):
            raise _contradiction(
                f"algo.dr_grpo and algo.{key}",
                f"dr_grpo=true with {key}={shown(getattr(a, key))}",
                f"dr_grpo means {key}={spelled}; set algo.{key}=null (it then follows "
                "dr_grpo), or algo.dr_grpo=false",
            )


def _check_filter(c: Config) -> None:
    """Filter settings that cannot work with the rest."""
    a = c.algo
    strategy = _check_filter_spelling(a)
    if a.filter_metric.endswith("_variance") and c.rollout.group_size < 2:
        _check_spread_of_one(a, strategy, c.rollout.group_size)
    if strategy != "top_k" and c.monitor.rollback_filter_ratio is not None:
        raise _contradiction(
            "monitor.rollback_filter_ratio and algo.filter_strategy",
            f"{c.monitor.rollback_filter_ratio} with {strategy}",
            f"{strategy} filtering does not read filter_ratio; set "
            "monitor.rollback_filter_ratio=null, or use filter_strategy=top_k",
        )
    _check_signed_shares(a, strategy)
    _check_advantage_weights(c)


SIGNED_METRICS = ("reward", "reward_sum")
"""Filter metrics whose scores may be negative (a return: step costs, format penalties)."""


def _check_signed_shares(a: AlgoConfig, strategy: str) -> None:
    """Linear top_p (a share of the summed score) and min_p (a share of the best score)
    read scores as amounts >= 0; by a mean or summed return, which may be negative, they
    would keep no group (the target is met before the first) or a wrong set."""
    linear_top_p = strategy == "top_p" and a.filter_top_p_mode == "linear"
    if a.filter_metric not in SIGNED_METRICS or not (linear_top_p or strategy == "min_p"):
        return
    key = FILTER_VALUE_KEYS[strategy]
    if getattr(a, key) >= 1.0:
        return  # top_p keeps every group, min_p the best: right whatever the sign
    shown = "top_p (linear)" if linear_top_p else strategy
    raise _contradiction(
        "algo.filter_strategy and algo.filter_metric",
        f"{shown} by {a.filter_metric}",
        f"{shown} takes a share of scores that must not be negative, and a return can be; "
        "use filter_strategy=top_k or top_k_abs, algo.filter_top_p_mode=softmax, or a metric "
        "that is never negative (reward_variance, entropy, entropy_variance, length)",
    )


def _check_filter_spelling(a: AlgoConfig) -> str:
    """The old spelling filter_mode against the new keys, and filter_type against the
    strategy; returns the strategy the filter runs."""
    strategy, kind = a.filter_choice()
    default = AlgoConfig()
    unset = (default.filter_strategy, default.filter_type)
    if a.filter_mode in OLD_FILTER_MODES and (a.filter_strategy, a.filter_type) not in (
        unset,
        (strategy, kind),
    ):
        means = f"algo.filter_strategy={strategy} algo.filter_type={kind}"
        raise _contradiction(
            "algo.filter_mode and algo.filter_strategy / algo.filter_type",
            f"{a.filter_mode} with {a.filter_strategy} / {a.filter_type}",
            f"filter_mode is their old spelling ({a.filter_mode} means {means}); drop "
            "algo.filter_mode",
        )
    if kind == "smallest" and strategy not in ("top_k", "top_k_abs"):
        raise _contradiction(
            "algo.filter_type and algo.filter_strategy",
            f"smallest with {strategy}",
            f"{strategy} measures each group against the largest scores; set "
            "algo.filter_type=largest, or use filter_strategy=top_k or top_k_abs",
        )
    return strategy


def _check_spread_of_one(a: AlgoConfig, strategy: str, group_size: int) -> None:
    """A filter by a spread (a *_variance metric) with one rollout a group, where every
    group's spread is 0: only one that keeps every group may run."""
    key = FILTER_VALUE_KEYS[strategy]
    if strategy not in ("top_k", "top_p"):
        raise _contradiction(
            "algo.filter_strategy and rollout.group_size",
            f"{strategy} by {a.filter_metric} with group_size={group_size}",
            f"filtering ranks groups by {a.filter_metric}, which needs group_size >= 2; or "
            "set algo.filter_metric=reward",
        )
    if getattr(a, key) < 1.0:
        raise _contradiction(
            f"algo.{key} and rollout.group_size",
            f"{getattr(a, key)} with group_size={group_size}",
            f"filtering ranks groups by {a.filter_metric}, which needs group_size >= 2; or "
            f"set algo.{key}=1",
        )
    if not a.filter_include_zero:
        raise _contradiction(
            "algo.filter_include_zero and rollout.group_size",
            f"false with group_size={group_size}",
            "one rollout has no spread, so every group would be dropped at every step; "
            "set rollout.group_size >= 2 or algo.filter_include_zero=true",
        )


def _check_advantage_weights(c: Config) -> None:
    """What the filter's advantage weights (loss scaling, soft reweight) cannot run with."""
    a = c.algo
    if a.soft_advantage_reweight and a.estimator != "grpo":
        raise _contradiction(
            "algo.soft_advantage_reweight and algo.estimator",
            f"true with {a.estimator}",
            "the reweight scales grpo's group-normalised advantages by each group's reward "
            "std; use algo.estimator=grpo, or set algo.soft_advantage_reweight=false",
        )


def kept_count(groups: int, keep_ratio: float) -> int:
    """Groups kept out of ``groups`` by a ``keep_ratio`` filter:
    ``max(1, ceil(groups * keep_ratio - 1e-9))`` (the 1e-9 keeps 0.25 * 8 at 2, not 3, when
    the product rounds up in floating point). The config's checks and the filter both use it.
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must lie in (0, 1], got {keep_ratio}; 1 keeps every group")
    return min(groups, max(1, math.ceil(groups * keep_ratio - 1e-9)))


_KEPT_RULES = {"top_k": "ceil(groups × filter_ratio)", "top_k_abs": "min(groups, filter_k)"}
"""How many groups each strategy keeps, as the mini-batch check explains it; the others
keep at most every group."""


def kept_groups(c: Config) -> int:
    """Groups the rollout filter keeps each step: exactly this many with top_k and top_k_abs
    (fewer when filter_include_zero=false leaves fewer candidates); at most this many, every
    group, with top_p and min_p, which keep fewer, even none (the step then skips its
    update), when the scores are small."""
    strategy, _ = c.algo.filter_choice()
    if strategy == "top_k":
        return kept_count(c.rollout.groups, c.algo.filter_ratio)
    if strategy == "top_k_abs":
        return min(c.rollout.groups, c.algo.filter_k)
    return c.rollout.groups


def kept_episodes(c: Config) -> int:
    """Episodes that reach the update each step (at most, see :func:`kept_groups`)."""
    return kept_groups(c) * c.rollout.group_size


def _check_eval_options(c: Config) -> None:
    """Each name env.eval_options gives options to is an eval env other than the training
    env (whose options, env.options, hold for its evaluation too)."""
    for name in c.env.eval_options:
        if name == c.env.name:
            raise ConfigError(
                f"config: env.eval_options names {shown(name)}, the training env: "
                "set its options in env.options (they hold for its evaluation too)"
            )
        if name not in c.env.eval_names:
            raise ConfigError(
                f"config: env.eval_options names {shown(name)}, which env.eval_names "
                f"({shown(c.env.eval_names)}) does not evaluate: add it there or drop it"
            )
