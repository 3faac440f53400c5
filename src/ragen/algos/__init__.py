"""RL math of ragen as pure tensor functions: advantage estimators, losses, group filtering.

Nothing here knows an environment, and no math reads a config: the trainer passes tensors and
floats (to the estimators, one ``Coefficients`` object of them, built from ``config.algo``).
"""

from ragen.algos.advantages import (
    ESTIMATORS,
    NEEDS_CRITIC,
    Coefficients,
    bi_level_gae,
    estimate,
    gae,
    grpo,
    reinforce_pp,
    rloo,
    whiten,
)
from ragen.algos.filtering import (
    METRICS,
    RULES,
    FilterRule,
    advantage_weights,
    group_std,
    kept_count,
    sampled_entropy,
    select_groups,
)
from ragen.algos.losses import (
    AGG_MODES,
    KL_KINDS,
    aggregate,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    logprobs_and_entropy,
    masked_mean,
    policy_loss,
    token_logprobs,
    value_loss,
)
from ragen.algos.packing import discounted_suffix_sum

__all__ = [
    "AGG_MODES",
    "ESTIMATORS",
    "KL_KINDS",
    "METRICS",
    "NEEDS_CRITIC",
    "RULES",
    "Coefficients",
    "FilterRule",
    "advantage_weights",
    "aggregate",
    "bi_level_gae",
    "discounted_suffix_sum",
    "entropy_from_logits",
    "estimate",
    "explained_variance",
    "gae",
    "group_std",
    "grpo",
    "kept_count",
    "kl_penalty",
    "logprobs_and_entropy",
    "masked_mean",
    "policy_loss",
    "reinforce_pp",
    "rloo",
    "sampled_entropy",
    "select_groups",
    "token_logprobs",
    "value_loss",
    "whiten",
]
