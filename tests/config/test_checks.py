"""Settings that are each valid but cannot work together: refused in one line naming the keys
and the fix; and what the rollout filter keeps, which bounds the mini-batch."""

import pytest

from ragen import config
from ragen.config import ConfigError

BAD_COMBINATIONS = [
    # (overrides, key named in the message, words that say what is allowed)
    (["rollout.max_actions_per_turn=5"], "rollout.max_actions_per_turn", "lower"),
    (["rollout.max_reply_tokens=2000"], "rollout.max_reply_tokens", "raise max_context_tokens"),
    (["algo.estimator=grpo", "rollout.group_size=1"], "rollout.group_size", ">= 2"),
    (["trainer.mini_batch_size=64"], "trainer.mini_batch_size", "lower"),
    (["trainer.micro_batch_size=32"], "trainer.micro_batch_size", "lower"),
    (["trainer.device=tpu"], "trainer.device", "cuda:N"),
    (["rollout.groups=512", "rollout.group_size=256"], "rollout.groups", "lower one of them"),
    (["trainer.device=cuda:abc"], "trainer.device='cuda:abc'", "cuda:N with N from 0 to 127"),
    (["trainer.device=cuda:128"], "trainer.device", "from 0 to 127"),  # torch: cuda:-128
    (["trainer.device=cuda:01"], "trainer.device", "cuda:N"),
    # top_p keeps up to every group: a mini-batch may reach all episodes, not beyond
    (
        ["algo.filter_mode=top_p", "trainer.mini_batch_size=64"],
        "trainer.mini_batch_size",
        "64 > 32 = groups × group_size",
    ),
    (["algo.filter_mode=top_p", "rollout.group_size=1"], "algo.filter_top_p", "filter_top_p=1"),
    (
        ["algo.filter_include_zero=false", "algo.filter_ratio=1", "rollout.group_size=1"],
        "algo.filter_include_zero",
        "group_size >= 2",
    ),
    (
        ["algo.filter_mode=top_p", "monitor.rollback_filter_ratio=0.25"],
        "monitor.rollback_filter_ratio",
        "filter_strategy=top_k",
    ),
    (
        ["algo.filter_strategy=min_p", "monitor.rollback_filter_ratio=0.25"],
        "monitor.rollback_filter_ratio",
        "min_p filtering does not read filter_ratio",
    ),
    (
        ["algo.filter_strategy=top_k_abs", "rollout.group_size=1", "trainer.mini_batch_size=2"],
        "algo.filter_strategy and rollout.group_size",
        "filter_metric=reward",
    ),
    (["algo.filter_strategy=top_p", "algo.filter_type=smallest"], "algo.filter_type", "largest"),
    (
        ["algo.filter_strategy=top_p", "algo.filter_metric=reward"],
        "algo.filter_strategy and algo.filter_metric",
        "filter_top_p_mode=softmax",
    ),
    (
        ["algo.filter_strategy=min_p", "algo.filter_metric=reward_sum"],
        "algo.filter_strategy and algo.filter_metric",
        "filter_strategy=top_k or top_k_abs",
    ),
    (["algo.soft_advantage_reweight=true"], "algo.soft_advantage_reweight", "estimator=grpo"),
    (["algo.dr_grpo=true"], "algo.dr_grpo and algo.estimator", "use algo.estimator=grpo"),
    (
        ["algo.estimator=grpo", "algo.dr_grpo=true", "algo.grpo_norm_by_std=true"],
        "algo.dr_grpo and algo.grpo_norm_by_std",
        "set algo.grpo_norm_by_std=null",
    ),
    (
        ["algo.estimator=grpo", "algo.dr_grpo=true", "algo.loss_agg=token_mean"],
        "algo.dr_grpo and algo.loss_agg",
        "dr_grpo means loss_agg=seq_mean_token_sum",
    ),
    (["env.eval_options.bandit.arm_names=[A, B]"], "env.eval_options", "set its options in"),
    (["env.eval_options.sokoban.spaced=true"], "env.eval_options", "does not evaluate"),
    (["rollout.context_turns=3"], "rollout.context_turns", "context_window=limited_multi_turn"),
    # monitor settings that could never act as written
    (
        ["monitor.enabled=false", "monitor.variance_collapse_steps=10"],
        "monitor.enabled",
        "set monitor.enabled=true",
    ),
    (["monitor.enabled=false", "monitor.action=stop"], "monitor.enabled", "action=warn"),
    (
        ["trainer.eval_every=0", "monitor.eval_floor_evals=5"],
        "monitor.eval_floor_evals and trainer.eval_every",
        "set trainer.eval_every",
    ),
    (["monitor.act_on=early_stop"], "monitor.act_on", "or act on collapse"),
    (["monitor.action=rollback", "trainer.eval_every=0"], "monitor.action=rollback", "nonzero"),
    (
        ["monitor.action=rollback", "trainer.eval_every=4", "trainer.save_every=6"],
        "eval_every=4, save_every=6",
        "make trainer.save_every a multiple",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"), BAD_COMBINATIONS, ids=[b[1] for b in BAD_COMBINATIONS]
)
def test_contradictions_are_refused_with_the_keys_named(overrides, key, allowed):
    with pytest.raises(ConfigError) as err:
        config.load("bandit", overrides)
    message = str(err.value)
    assert key in message and allowed in message
    assert "\n" not in message


def test_monitor_settings_that_act_load():
    for overrides in (
        ["monitor.action=rollback", "trainer.eval_every=5", "trainer.save_every=10"],
        ["monitor.act_on=early_stop", "monitor.variance_collapse_steps=10"],
        ["monitor.enabled=false"],
        ["trainer.eval_every=0", "monitor.variance_collapse_steps=10", "monitor.action=stop"],
    ):
        config.load("bandit", overrides)


def test_a_windowed_micro_batch_counts_turn_samples_past_the_episodes():
    # 4 episodes a mini-batch hold up to 4 × max_turns samples: 8 of them a pass is a slice
    windowed = ["trainer.mini_batch_size=4", "trainer.micro_batch_size=8"]
    c = config.load("bandit", [*windowed, "rollout.context_window=single_turn"])
    assert c.trainer.micro_batch_size == 8
    with pytest.raises(ConfigError, match=r"trainer\.micro_batch_size"):
        config.load("bandit", windowed)


def test_a_signed_metric_runs_with_the_strategies_that_rank_it():
    # top_k ranks, softmax top_p takes a probability mass, top_p at 1 keeps every group and
    # min_p at 1 the best: none reads a negative score as an amount
    for overrides in (
        ["algo.filter_strategy=top_k"],
        ["algo.filter_strategy=top_p", "algo.filter_top_p_mode=softmax"],
        ["algo.filter_strategy=top_p", "algo.filter_top_p=1"],
        ["algo.filter_strategy=min_p", "algo.filter_min_p=1"],
    ):
        c = config.load("bandit", [*overrides, "algo.filter_metric=reward"])
        assert c.algo.filter_metric == "reward"


def test_top_p_bounds_the_mini_batch_by_every_episode():
    c = config.load("bandit", ["algo.filter_mode=top_p", "trainer.mini_batch_size=32"])
    assert config.kept_groups(c) == 8 and config.kept_episodes(c) == 32
    # with one rollout per group top_p=1 keeps everything: filter_ratio is not read
    config.load(
        "bandit",
        [
            "algo.filter_mode=top_p",
            "algo.filter_top_p=1",
            "rollout.group_size=1",
            "trainer.mini_batch_size=8",
            "trainer.micro_batch_size=8",
        ],
    )


def test_each_filter_strategy_bounds_the_mini_batch_by_what_it_keeps():
    def kept(*overrides):
        return config.kept_groups(config.load("bandit", list(overrides)))

    assert kept("algo.filter_strategy=top_k_abs", "algo.filter_k=5") == 5
    assert kept("algo.filter_strategy=top_k_abs", "algo.filter_k=50") == 8  # all 8 groups
    assert kept("algo.filter_strategy=min_p") == 8  # at most every group
    with pytest.raises(config.ConfigError, match=r"16 > 12 = min\(groups, filter_k\)"):
        config.load("bandit", ["algo.filter_strategy=top_k_abs", "algo.filter_k=3"])


def test_filter_weights_run_where_the_trainer_holds_the_advantages():
    config.load("bandit", ["algo.estimator=grpo", "algo.soft_advantage_reweight=true"])
    # with gae too: the trainer then takes a values pass (tests/train/test_update_paths.py)
    config.load("bandit", ["algo.estimator=gae", "algo.filter_loss_scaling=linear"])
    config.load("bandit", ["algo.estimator=grpo", "algo.filter_loss_scaling=sqrt"])
