"""Reward terms: the env reward, the format penalty and configured shaping terms add up to
each turn's reward, and each is logged on its own."""

import sys

import pytest
from tests.rollout.test_loop import ScriptedReplies

from ragen.monitor.metrics import rollout_metrics
from ragen.rollout import rewards
from ragen.rollout.loop import RolloutSpec, rollout

SPEC = dict(max_turns=2, max_actions_per_turn=1, max_actions_per_episode=2, max_reply_tokens=40)


def double_answer_words(turn):
    """A user-defined term, imported by module:function."""
    return 2.0 * len(turn.answer.split())


def test_terms_add_up_to_the_reward_and_are_logged(tokenizer):
    # turn 1 thinks and answers nothing valid; turn 2 does not think and pulls an arm
    script = ["I pick.</think><answer>Neither</answer>", "</think><answer>Phoenix</answer>"]
    terms = (("think_bonus", 0.05), ("tests.rollout.test_rewards:double_answer_words", -0.01))
    spec = RolloutSpec(**SPEC, reward_terms=terms)
    trajs = rollout(ScriptedReplies(tokenizer, script), tokenizer, "bandit", [3], 2, spec)
    first, second = trajs[0].turns
    name = terms[1][0]
    assert first.terms == pytest.approx(
        {"env": 0.0, "format": -0.1, "think_bonus": 0.05, name: -0.02}
    )
    assert second.terms == pytest.approx(
        {"env": 0.15, "format": 0.0, "think_bonus": 0.0, name: -0.02}
    )
    assert first.reward == pytest.approx(-0.07) and second.reward == pytest.approx(0.13)
    assert trajs[0].total_reward == pytest.approx(0.06)
    logged = rollout_metrics(trajs)
    assert logged["reward/env"] == pytest.approx(0.15)
    assert logged["reward/format"] == pytest.approx(-0.1)
    assert logged["reward/think_bonus"] == pytest.approx(0.05)
    assert logged[f"reward/{name}"] == pytest.approx(-0.04)


def test_answered_think_tokens_pays_only_a_reply_that_acted(tokenizer):
    # turn 1 thinks, then answers nothing valid; turn 2 thinks as long and pulls an arm
    script = [
        "I pick one.</think><answer>Neither</answer>",
        "I pick one.</think><answer>Phoenix</answer>",
    ]
    terms = (("answered_think_tokens", 0.02), ("think_tokens", 0.02))
    spec = RolloutSpec(**SPEC, reward_terms=terms)
    trajs = rollout(ScriptedReplies(tokenizer, script), tokenizer, "bandit", [3], 1, spec)
    first, second = trajs[0].turns
    assert first.think_tokens == second.think_tokens > 0
    assert first.terms["answered_think_tokens"] == 0.0
    assert first.terms["think_tokens"] == pytest.approx(0.02 * first.think_tokens)
    assert second.terms["answered_think_tokens"] == pytest.approx(0.02 * second.think_tokens)


def test_a_term_returning_nan_is_refused_by_name():
    with pytest.raises(ValueError, match="'bad' returned nan"):
        rewards.shaping(None, {"bad": (lambda turn: float("nan"), 1.0)})
    with pytest.raises(ValueError, match="module:function"):
        rewards.resolve("no_such_term")


@pytest.mark.parametrize("name", ["think_bonus", "mypkg.shaping:short_think", "this:s"])
def test_check_name_accepts_the_shape_of_a_term_and_imports_nothing(name, capsys):
    rewards.check_name(name)
    assert "mypkg" not in sys.modules
    assert capsys.readouterr().out == ""  # importing `this` prints the Zen of Python


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("env", "always part of the reward"),
        ("think-bonus", "module:function"),
        ("os.system('ls'):f", "module:function"),
        ("mypkg..shaping:f", "module:function"),
        ("mypkg:", "module:function"),
        (":f", "module:function"),
    ],
)
def test_check_name_refuses_what_is_no_term(name, message):
    with pytest.raises(ValueError, match=message):
        rewards.check_name(name)
