"""The schema: defaults, a docstring per field, an upper bound on every size, and the values
a config implies (whitening, the options each env is built with)."""

import dataclasses
import subprocess
import sys

import pytest

from ragen import config
from ragen.config import Config


def test_defaults_are_valid_and_follow_the_paper():
    c = config.validate(Config())
    # StarPO-S: filter to 25% of groups, no KL, clip 0.2 below and 0.28 above, critic (gae).
    assert (c.algo.filter_ratio, c.algo.kl_coef) == (0.25, 0.0)
    assert (c.algo.clip_low, c.algo.clip_high, c.algo.estimator) == (0.2, 0.28, "gae")
    assert (c.rollout.groups, c.rollout.group_size, c.rollout.max_turns) == (8, 16, 5)
    assert (c.trainer.actor_lr, c.trainer.critic_lr, c.trainer.grad_clip) == (1e-6, 1e-5, 1.0)
    assert config.kept_groups(c) == 2 and config.kept_episodes(c) == 32


def test_every_field_has_a_docstring():
    sections = [Config, *(f.type for f in dataclasses.fields(Config))]
    for cls in sections:
        cls = getattr(config, cls) if isinstance(cls, str) else cls
        names = {f.name for f in dataclasses.fields(cls)}
        docs = config.field_docs(cls)
        assert names == set(docs), cls
        assert all(len(doc) > 10 for doc in docs.values())


def test_every_int_size_has_an_upper_bound():
    # model.lora_* are bounded against the model itself, by the model checks.
    sections = [f.type for f in dataclasses.fields(Config) if f.name != "model"]
    for cls in [getattr(config, name) for name in sections]:
        for f in dataclasses.fields(cls):
            if f.type == "int":
                assert "le" in f.metadata, f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize(
    ("overrides", "whitens"),
    [
        ([], True),  # gae: RAGEN whitens GAE advantages
        (["algo.estimator=bi_level_gae"], True),
        (["algo.estimator=grpo"], False),
        (["algo.estimator=rloo"], False),
        (["algo.estimator=reinforce_pp"], False),  # whitens its own
        (["algo.estimator=grpo", "algo.whiten_advantages=true"], True),
        (["algo.whiten_advantages=false"], False),
    ],
)
def test_advantage_whitening_follows_the_estimator_unless_set(overrides, whitens):
    c = config.load("sokoban-rl", overrides)
    assert c.algo.whitens() is whitens
    if not any("whiten" in o for o in overrides):  # the default is shown as null
        assert "whiten_advantages: null" in config.to_yaml(c)


@pytest.mark.parametrize(
    ("overrides", "aggregation", "norm_by_std"),
    [
        ([], "token_mean", True),
        (["algo.dr_grpo=true"], "seq_mean_token_sum", False),
        (["algo.dr_grpo=true", "algo.grpo_norm_by_std=false"], "seq_mean_token_sum", False),
        (["algo.dr_grpo=true", "algo.loss_agg=seq_mean_token_sum"], "seq_mean_token_sum", False),
        (["algo.grpo_norm_by_std=false"], "token_mean", False),
        (["algo.loss_agg=seq_mean_token_mean"], "seq_mean_token_mean", True),
    ],
)
def test_dr_grpo_sets_the_aggregation_and_std_division_left_null(
    overrides, aggregation, norm_by_std, tmp_path
):
    c = config.load("bandit", ["algo.estimator=grpo", *overrides])
    assert (c.algo.aggregation(), c.algo.norm_by_std()) == (aggregation, norm_by_std)
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml(c))
    again = config.load(str(path))  # a run's config.yaml reloads to the same run
    assert (again.algo.aggregation(), again.algo.norm_by_std()) == (aggregation, norm_by_std)


def test_eval_envs_take_their_own_options_and_the_training_env_takes_env_options():
    c = config.load(
        "sokoban-rl",
        [
            "env.options.spaced=true",
            "env.eval_names=[sokoban, sokoban-large, frozen-lake]",
            "env.eval_options.sokoban-large={spaced: true, num_boxes: 1}",
        ],
    )
    assert config.env_options(c, "sokoban") == {"spaced": True}
    assert config.env_options(c, "sokoban-large") == {"spaced": True, "num_boxes": 1}
    assert config.env_options(c, "frozen-lake") == {}


def test_the_schema_imports_nothing_of_ragen_beyond_the_config():
    # Every layer reads the schema: loading it must not pull models, envs, algos or the trainer.
    code = (
        "import sys, ragen.config; "
        "print(sorted(m for m in sys.modules if m.startswith('ragen') "
        "and not m.startswith('ragen.config') and m != 'ragen'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
