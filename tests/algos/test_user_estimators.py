"""Estimators of the user's own, named ``package.module:function`` in algo.estimator: judged by
the name's shape when a config is checked, imported when the run starts, called with the same
tensors and Coefficients as ragen's."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from ragen import config
from ragen.algos import advantages as adv
from ragen.config import AlgoConfig, ConfigError
from ragen.train import preflight

MODULE = "ragen_test_user_estimators"
SOURCE = f"""
import torch

open({{marker!r}}, "w").close()  # proves the module was imported


def scaled_scores(*, mask, scores, coefs, **_):
    # gamma * the episode's return, on every sampled token
    adv = torch.where(mask != 0, coefs.gamma * scores[:, None], 0.0)
    return adv, adv.clone()


def flat(scores, **_):
    return scores, scores  # (B,), not (B, T)


not_a_function = 3

assert __name__ == {MODULE!r}
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of estimators importable as MODULE, and the file its import creates."""
    marker = tmp_path / "imported"
    (tmp_path / f"{MODULE}.py").write_text(SOURCE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    yield marker
    sys.modules.pop(MODULE, None)


MASK = torch.tensor([[0.0, 1, 1, 0], [1, 0, 1, 1]])
SCORES = torch.tensor([2.0, -1.0])


def _estimate(name: str, coefs: adv.Coefficients) -> tuple[torch.Tensor, torch.Tensor]:
    return adv.estimate(
        name,
        rewards=torch.zeros(2, 4),
        mask=MASK,
        scores=SCORES,
        group_ids=torch.tensor([0, 0]),
        coefs=coefs,
    )


def test_a_user_estimator_is_called_with_the_batch_and_the_coefficients(user_module):
    a, r = _estimate(f"{MODULE}:scaled_scores", adv.Coefficients.of(AlgoConfig(gamma=0.5)))
    # 0.5 * 2 = 1 and 0.5 * -1 = -0.5 on the sampled tokens, 0 elsewhere
    torch.testing.assert_close(a, torch.tensor([[0.0, 1, 1, 0], [-0.5, 0, -0.5, -0.5]]))
    torch.testing.assert_close(r, a)
    assert user_module.exists()


def test_a_config_value_reaches_the_estimator_with_no_other_edit(user_module):
    c = config.load("bandit", [f"algo.estimator={MODULE}:scaled_scores", "algo.gamma=0.25"])
    a, _ = _estimate(c.algo.estimator, adv.Coefficients.of(c.algo))
    torch.testing.assert_close(a, 0.25 * SCORES[:, None] * MASK)


def test_each_coefficient_is_the_config_field_of_its_name():
    algo = AlgoConfig(
        gamma=0.9,
        lam=0.8,
        turn_gamma=0.7,
        grpo_norm_by_std=False,
        gigpo_step_weight=0.5,
        gigpo_gamma=0.6,
        gigpo_mode="mean_std_norm",
    )
    coefs = adv.Coefficients.of(algo)
    assert dataclasses.asdict(coefs) == {
        "gamma": 0.9,
        "lam": 0.8,
        "turn_gamma": 0.7,
        "grpo_norm_by_std": False,
        "gigpo_step_weight": 0.5,
        "gigpo_gamma": 0.6,
        "gigpo_mode": "mean_std_norm",
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        coefs.gamma = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "name",
    [
        "ppo",
        "my_estimators.median",
        "my_estimators:1st",
        ":median",
        "my estimators:median",
        "a:b:c",
    ],
)
def test_a_name_of_the_wrong_shape_is_refused_when_the_config_is_checked(name):
    with pytest.raises(ConfigError, match=r"algo.estimator") as err:
        preflight.check_references(config.load("bandit", [f"algo.estimator={name}"]))
    message = str(err.value)
    assert "use one of gae, grpo, bi_level_gae, rloo, reinforce_pp" in message
    assert "or module:function for your own" in message and "\n" not in message


def test_loading_or_writing_a_config_imports_no_estimator(user_module, tmp_path):
    c = config.load("bandit", [f"algo.estimator={MODULE}:scaled_scores"])
    # A run's config.yaml (what --resume loads) is checked without importing either.
    saved = tmp_path / "config.yaml"
    saved.write_text(config.to_yaml(c))
    assert config.load(str(saved)).algo.estimator == f"{MODULE}:scaled_scores"
    assert not user_module.exists()
    preflight.import_estimator(c)  # when the run starts
    assert user_module.exists()


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("ragen_no_such_module:f", "No module named 'ragen_no_such_module': install its package"),
        (f"{MODULE}:missing", f"module '{MODULE}' has no attribute 'missing'"),
        (f"{MODULE}:not_a_function", "is int, not a function"),
    ],
)
def test_an_estimator_that_cannot_be_imported_is_refused_when_the_run_starts(
    user_module, name, problem
):
    c = config.load("bandit", [f"algo.estimator={name}"])  # the shape is right
    with pytest.raises(ConfigError, match=r"algo.estimator") as err:
        preflight.import_estimator(c)
    assert problem in str(err.value) and repr(name) in str(err.value)


def test_a_result_that_is_not_two_token_tensors_is_refused_by_name(user_module):
    with pytest.raises(ValueError, match=rf"'{MODULE}:flat' returned \[\(2,\), \(2,\)\]"):
        _estimate(f"{MODULE}:flat", adv.Coefficients.of(AlgoConfig()))


@pytest.mark.parametrize(
    ("overrides", "critic"),
    [
        ([], True),  # gae
        (["algo.estimator=grpo"], False),
        (["algo.estimator=bi_level_gae", "algo.critic=true"], True),  # says what it does
        (["algo.estimator=mine:f"], False),
        (["algo.estimator=mine:f", "algo.critic=true"], True),
        (["algo.estimator=mine:f", "algo.critic=false"], False),
    ],
)
def test_the_config_alone_says_whether_a_critic_is_trained(overrides, critic):
    assert config.load("bandit", overrides).algo.trains_critic() is critic


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (["algo.critic=false"], "gae reads critic values"),
        (["algo.estimator=rloo", "algo.critic=true"], "rloo reads no critic values"),
    ],
)
def test_a_critic_setting_that_contradicts_a_builtin_estimator_is_refused(overrides, fix):
    with pytest.raises(ConfigError, match=r"algo.critic and algo.estimator") as err:
        config.load("bandit", overrides)
    assert fix in str(err.value) and "set algo.critic=null" in str(err.value)


def test_a_user_estimator_is_not_whitened_unless_asked():
    c = config.load("bandit", ["algo.estimator=mine:f"])
    assert not c.algo.whitens()
    c = config.load("bandit", ["algo.estimator=mine:f", "algo.whiten_advantages=true"])
    assert c.algo.whitens()


def test_the_group_size_a_user_estimator_needs_is_not_checked():
    # grpo refuses one-member groups; ragen cannot know whether a user's estimator compares
    # within groups, so the config does not refuse it (filter_ratio=1: the filter needs groups)
    single = ["rollout.group_size=1", "algo.filter_ratio=1", "trainer.mini_batch_size=8"]
    single += ["trainer.micro_batch_size=8"]
    assert config.load("bandit", ["algo.estimator=mine:f", *single]).rollout.group_size == 1
    with pytest.raises(ConfigError, match=r"set rollout.group_size >= 2"):
        config.load("bandit", ["algo.estimator=grpo", *single])
