"""The metric names other code reads: the contract between what a run writes into
metrics.jsonl and what the collapse detector, `ragen report` and the viewer read from it.

Producers (the rollout metrics, the update, the filter, the template probe, the SFT step)
write these names through the constants below, and readers look them up through the same
constants, so a rename moves both sides. The collapse detector refuses to watch a name
missing from `PRODUCED`, and a test plays real steps and checks that every name here is
written (the viewer's page, which cannot import this module, is checked by a test that reads
it).
"""

from __future__ import annotations

# rollout/… : what the step's episodes did (ragen.monitor.metrics.rollout_metrics)
SUCCESS = "rollout/success"
EPISODES = "rollout/episodes"
REWARD_MEAN = "rollout/reward_mean"
REWARD_STD = "rollout/reward_std"
FORMAT_OK = "rollout/format_ok"
TURNS_PER_EPISODE = "rollout/turns_per_episode"
REPLY_TOKENS = "rollout/reply_tokens"
THINK_TOKENS = "rollout/think_tokens"
CONTEXT_TOKENS = "rollout/context_tokens"

# diversity/… and think/… : how varied the replies are (ragen.monitor.metrics.diversity)
DISTINCT_REPLY = "diversity/distinct_reply"
DISTINCT_THINK = "diversity/distinct_2gram_think"
THINK_TOKENS_MEAN = "think/tokens_mean"
THINK_EMPTY_SHARE = "think/empty_share"
THINK_TEMPLATE_SHARE = "think/template_share"
ACTION_TEMPLATE_SHARE = "diversity/action_template_share"

# filter/… : what the uncertainty filter kept (ragen.algos.filtering.select_groups)
KEPT_GROUPS = "filter/kept_groups"
KEPT_RATIO = "filter/kept_ratio"
ZERO_STD_GROUPS = "filter/zero_std_groups"
"""Groups whose episodes all got the same return: GRPO's advantage is 0 on each."""

# gigpo/… : what GiGPO's per-turn credit had to compare, on gigpo runs only
# (ragen.monitor.metrics.credit_metrics)
GIGPO_ANCHORED_SHARE = "gigpo/anchored_share"
GIGPO_TURNS_PER_ANCHOR = "gigpo/turns_per_anchor"
GIGPO_EPISODE_ADV = "gigpo/episode_adv_abs"
GIGPO_STEP_ADV = "gigpo/step_adv_abs"
GIGPO_ONLY = frozenset(
    {GIGPO_ANCHORED_SHARE, GIGPO_TURNS_PER_ANCHOR, GIGPO_EPISODE_ADV, GIGPO_STEP_ADV}
)
"""The names only a gigpo run writes."""

# perf/… : what the step cost (ragen.train.trainer)
MEMORY_CUTS = "perf/memory_cuts"
UPDATE_MEMORY_CUTS = "perf/update_memory_cuts"

# actor/… : the policy update (ragen.train.update)
ENTROPY = "actor/entropy"
GRAD_NORM = "actor/grad_norm"

# collapse/… : the template-collapse probe, every monitor.template_every steps
MI = "collapse/mi_estimate"
RETRIEVAL_ACC = "collapse/retrieval_acc"

# sft/… : a `ragen sft` step (ragen.train.sft)
SFT_LOSS = "sft/loss"
SFT_GRAD_NORM = "sft/grad_norm"

# grad_norm/… : RAGEN-2's gradient reporter (ragen.train.gradient_analysis), on the steps
# trainer.gradient_analysis_every picks: grad_norm/<bucket>/<quantity>, the bucket one of
# bucket_1 … bucket_K (lowest reward variance first) or all, the quantity a loss term's
# gradient norm or one of BUCKET_FACTS.
GRAD_NORM_TERMS = ("task", "entropy", "kl", "value")
"""The loss terms whose gradient norms the reporter logs, each where the loss has it."""
BUCKET_FACTS = ("rows", "tokens", "reward_std_min", "reward_std_max")
"""What the reporter logs of each bucket besides the norms: its rows (episodes, or turn
samples when the context window is not full), their sampled tokens, and the range of its
groups' reward std."""


def bucket_metric(bucket: str, quantity: str) -> str:
    """``grad_norm/<bucket>/<quantity>``: a metric of the gradient reporter."""
    return f"grad_norm/{bucket}/{quantity}"


def parse_bucket_metric(key: str) -> tuple[str, str] | None:
    """(bucket, quantity) of a `bucket_metric` name; None for any other name."""
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "grad_norm" and parts[1] and parts[2]:
        return parts[1], parts[2]
    return None


PRODUCED: frozenset[str] = frozenset(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)
"""Every name above: each is written by some run."""
