"""Plain data → the schema's dataclasses: unknown keys, wrong types and out-of-range values
refused in one line naming the key, the value and what is allowed."""

import pytest

from ragen import config
from ragen.config import ConfigError

BAD_VALUES = [
    # (overrides, key named in the message, words that say what is allowed)
    (["algo.clip_hgh=0.3"], "algo.clip_hgh", "did you mean algo.clip_high"),
    (["colour.mode=1"], "colour", "allowed here"),
    (["rollout.group_size=two"], "rollout.group_size", "an integer"),
    (["rollout.group_size=true"], "rollout.group_size", "an integer"),
    (["rollout.group_size=2.5"], "rollout.group_size", "an integer"),
    (["rollout.think=1"], "rollout.think", "true or false"),
    (["trainer.actor_lr=fast"], "trainer.actor_lr", "a number"),
    (["trainer.actor_lr=.nan"], "trainer.actor_lr", "a number"),
    (["env.eval_names=bandit"], "env.eval_names", "a list"),
    (["algo.clip_high=-1"], "algo.clip_high", "> 0.0"),
    (["algo.filter_ratio=1.5"], "algo.filter_ratio", "<= 1.0"),
    (["algo.dual_clip=0.5"], "algo.dual_clip", "> 1.0"),
    (["trainer"], "trainer", "section.key=value"),
    (["rollout=3"], "rollout", "mapping"),
    # A falsy section once reset the whole section to its defaults without a word.
    (["rollout=[]"], "rollout must be a mapping", "got []"),
    (["model=null"], "model must be a mapping", "got null"),
    # Sizes that passed and then hung or crashed the run after its folder was made.
    (["rollout.groups=1000000000"], "rollout.groups=1000000000", "<= 65536"),
    (["rollout.group_size=" + "1" + "0" * 21], "rollout.group_size", "<= 65536"),
    (["trainer.seed=9223372036854775808"], "trainer.seed", "<= 4294967295"),
    (["trainer.eval_episodes=1000000000"], "trainer.eval_episodes", "<= 1000000"),
    (["rollout.max_context_tokens=2000000"], "rollout.max_context_tokens", "<= 1048576"),
    (["trainer.steps=10000000000"], "trainer.steps", "<= 1000000"),
    (["monitor.template_pairs=100000"], "monitor.template_pairs", "<= 256"),
    (["algo.filter_strategy=top_n"], "algo.filter_strategy", "top_k, top_k_abs, top_p, min_p"),
    (["algo.filter_metric=std"], "algo.filter_metric", "reward_variance, reward, reward_sum"),
    (["algo.filter_empty_stop_steps=-1"], "algo.filter_empty_stop_steps", ">= 0"),
    (["algo.filter_top_p=0"], "algo.filter_top_p", "> 0.0"),
    (["algo.filter_mode=top_k"], "algo.filter_mode", "std, std_rev, top_p"),
    (["algo.whiten_advantages=2"], "algo.whiten_advantages", "true or false"),
    (["rollout.format_penalty_mode=always"], "rollout.format_penalty_mode", "any_invalid"),
    (["sft.thought=grid"], "sft.thought", "relative, located"),
    (["sft.lake_expert=greedy"], "sft.lake_expert", "optimal, toward, careful, sides"),
    (["sft.sokoban_expert=greedy"], "sft.sokoban_expert", "optimal, push, push_first"),
    (["sft.lr=1e308"], "sft.lr", "<= 1.0"),
    (["trainer.actor_lr=1e308"], "trainer.actor_lr", "<= 1.0"),
    (["trainer.critic_lr=2"], "trainer.critic_lr", "<= 1.0"),
    (["trainer.eval_split=train"], "trainer.eval_split", "dev, test"),
    (["model.attention=flash"], "model.attention", "ragen, sdpa"),
    (["trainer.scoring_pass=always"], "trainer.scoring_pass was removed", "drop the key"),
    (["trainer.prefix_sharing=mini_batch"], "trainer.prefix_sharing was removed", "once per"),
    (["trainer.sort_micro_batches=false"], "trainer.sort_micro_batches was removed", "like"),
]


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"), BAD_VALUES, ids=[b[1] for b in BAD_VALUES]
)
def test_bad_values_are_refused_with_the_key_named(overrides, key, allowed):
    with pytest.raises(ConfigError) as err:
        config.load("bandit", overrides)
    message = str(err.value)
    assert key in message and allowed in message
    assert "\n" not in message


def test_overrides_are_typed():
    c = config.load(
        "bandit",
        [
            "algo.clip_high=0.3",
            "trainer.actor_lr=1e-6",  # YAML reads this as a string; it is still a number
            "rollout.group_size=8",
            "env.eval_names=[bandit]",
            "algo.dual_clip=3",
            "env.options.high_risk=Phoenix",
            "rollout.think=false",
        ],
    )
    assert c.algo.clip_high == 0.3
    assert c.trainer.actor_lr == 1e-6 and isinstance(c.trainer.actor_lr, float)
    assert c.rollout.group_size == 8
    assert c.env.eval_names == ["bandit"]
    assert c.algo.dual_clip == 3.0
    assert c.env.options == {"high_risk": "Phoenix"}
    assert c.rollout.think is False


def test_bounds_leave_room_for_paper_scale_gpu_runs():
    c = config.load(
        "bandit-gpu",
        [
            "rollout.groups=1024",
            "rollout.group_size=64",
            "rollout.max_context_tokens=1000000",
            "rollout.max_reply_tokens=32768",
            "trainer.mini_batch_size=4096",
            f"trainer.eval_episodes={config.MAX_EVAL_EPISODES}",
            "trainer.seed=4294967295",
            "trainer.device=cuda:7",
        ],
    )
    assert config.kept_episodes(c) == 256 * 64
    with pytest.raises(ConfigError, match="<= 1000000"):
        config.load("bandit", [f"trainer.eval_episodes={config.MAX_EVAL_EPISODES + 1}"])


@pytest.mark.parametrize(
    ("override", "kind"),
    [("env.name=2048", "number"), ("env.name=1.5", "number"), ("model.spec=yes", "boolean")],
)
def test_a_name_yaml_reads_as_a_number_is_refused_with_the_quoting_that_fixes_it(override, kind):
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as refused:
        config.load("sudoku", [override])
    message = str(refused.value)
    assert f"YAML read it as a {kind}: quote it" in message
    shown = message.split("=", 1)[1].split(" ", 1)[0]
    fixed = config.load("sudoku", [f'{key}="{shown}"'])
    assert fixed.env.name == shown if key == "env.name" else fixed.model.spec == shown
