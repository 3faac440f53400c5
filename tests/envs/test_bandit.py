"""Bandit: arm order per seed, hand-checked payoffs, success, the rev and test variants."""

import pytest

from ragen import envs
from ragen.envs.bandit import BanditEnv, arm_order


def test_arm_order_varies_with_the_seed_and_is_fixed_per_seed():
    orders = {arm_order(seed, ("Dragon", "Phoenix")) for seed in range(20)}
    assert orders == {("Dragon", "Phoenix"), ("Phoenix", "Dragon")}
    assert arm_order(7, ("A", "B")) == arm_order(7, ("A", "B"))
    env = envs.make("bandit")
    texts = {env.reset(seed) for seed in range(20)}
    assert texts == {
        "Arms: Dragon, Phoenix. Which arm do you pull?",
        "Arms: Phoenix, Dragon. Which arm do you pull?",
    }


def test_low_risk_arm_always_pays_its_payoff_and_is_not_success():
    env = envs.make("bandit")
    for seed in range(50):
        env.reset(seed)
        result = env.step("Phoenix")
        assert result.reward == 0.15
        assert result.terminated and not result.truncated
        assert result.info == {"success": False, "action_valid": True, "action_effective": True}
        assert result.observation == "You pulled Phoenix and received 0.15."


def test_high_risk_arm_pays_one_about_a_quarter_of_the_time():
    env = envs.make("bandit")
    rewards = []
    for seed in range(2000):
        env.reset(seed)
        result = env.step("dragon")
        assert result.info["success"]
        rewards.append(result.reward)
    assert set(rewards) == {0.0, 1.0}
    # Binomial(2000, 0.25): mean 500, sd 19.4; 5 sd either side.
    assert 403 <= sum(rewards) <= 597


def test_same_seed_same_payoff():
    first, second = envs.make("bandit"), envs.make("bandit")
    for seed in range(30):
        first.reset(seed)
        second.reset(seed)
        assert first.step("Dragon") == second.step("DRAGON")


def test_bandit_rev_swaps_which_name_is_risky():
    env = envs.make("bandit-rev")
    env.reset(0)
    dragon = env.step("Dragon")
    assert dragon.reward == 0.15 and not dragon.info["success"]
    env.reset(0)
    assert env.step("Phoenix").info["success"]


def test_bandit_test_uses_other_names():
    env = envs.make("bandit-test")
    assert env.actions == ("Librarian", "Trader")
    env.reset(3)
    assert env.step("Librarian").reward == 0.15
    assert "Dragon" not in env.instructions()


def test_options_change_the_payoffs():
    env = BanditEnv(low_payoff=0.4, high_prob=1.0, high_payoff=2.0)
    env.reset(0)
    assert env.step("Dragon").reward == 2.0
    env.reset(0)
    assert env.step("Phoenix").reward == 0.4


def test_an_unknown_word_is_a_no_op_until_the_budget_truncates():
    env = envs.make("bandit", max_actions=2)
    first = env.reset(1)
    result = env.step("the dragon please")
    assert result.observation == first and result.reward == 0.0
    assert not result.info["action_valid"] and not result.terminated and not result.truncated
    result = env.step("Griffin")
    assert result.truncated and not result.terminated


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"high_prob": 1.5}, "high_prob must be between 0 and 1, got 1.5"),
        ({"high_risk": "Griffin"}, "high_risk must be one of 'Dragon', 'Phoenix'"),
        ({"arm_names": ("Dragon",)}, "arm_names must be two different"),
        ({"arm_names": ("Dragon", "dragon")}, "arm_names must be two different"),
        ({"arm_names": ("x||y", "z"), "high_risk": "z"}, "'x||y' could never be chosen"),
        ({"arm_names": ("a, b", "c"), "high_risk": "c"}, "holds an action separator"),
        ({"arm_names": ("a</answer>", "c"), "high_risk": "c"}, "holds a <think> or <answer> tag"),
        ({"low_payoff": float("nan")}, "low_payoff must be a finite number"),
        ({"max_actions": 0}, "max_actions must be >= 1"),
    ],
)
def test_bad_options_raise_value_errors_that_say_what_is_allowed(options, message):
    with pytest.raises(ValueError, match=message):
        BanditEnv(**options)
