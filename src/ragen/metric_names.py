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

# actor/… : the policy update (ragen.train.update)
ENTROPY = "actor/entropy"
GRAD_NORM = "actor/grad_norm"

# collapse/… : the template-collapse probe, every monitor.template_every steps
MI = "collapse/mi_estimate"
RETRIEVAL_ACC = "collapse/retrieval_acc"

# sft/… : a `ragen sft` step (ragen.train.sft)
SFT_LOSS = "sft/loss"
SFT_GRAD_NORM = "sft/grad_norm"

PRODUCED: frozenset[str] = frozenset(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)
"""Every name above: each is written by some run."""
