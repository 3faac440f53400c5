"""Countdown: the safe parser, the reward rule, and generated instances with known solutions."""

from fractions import Fraction

import pytest

from ragen import envs
from ragen.envs.base import GenerationError
from ragen.envs.countdown import (
    CountdownEnv,
    Evaluation,
    ExpressionError,
    evaluate,
    generate_instance,
    score,
)


@pytest.mark.parametrize(
    ("text", "numbers", "value"),
    [
        ("2 + 3 * 4", (2, 3, 4), 14),
        ("(2 + 3) * 4", (2, 3, 4), 20),
        ("10 - 4 - 3", (10, 4, 3), 3),  # left-associative
        ("48 / 4 / 2", (48, 4, 2), 6),
        ("8 / 3 * 3", (8, 3, 3), 8),  # exact fractions, no float round-off
        ("-(3 - 5)", (3, 5), 2),
        ("6 × 7 ÷ 2", (6, 7, 2), 21),
        ("12 \N{MINUS SIGN} 3", (12, 3), 9),  # the typeset minus a model may write
        ("  (1+2)*3 = 9 ", (1, 2, 3), 9),  # a restated target is ignored
        ("1 / 2", (1, 2), Fraction(1, 2)),
    ],
)
def test_evaluate_follows_arithmetic(text, numbers, value):
    assert evaluate(text) == Evaluation(numbers, Fraction(value))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "__import__('os').system('ls')",
        "2 ** 3",
        "2 +",
        "(2 + 3",
        "2 3",
        "1.5 * 2",
        "1234567 + 1",  # more digits than any given number
        "(" * 40 + "1" + ")" * 40,  # deeper than the nesting bound
        "1 + " * 60 + "1",  # longer than the length bound
    ],
)
def test_junk_is_not_an_expression(text):
    with pytest.raises(ExpressionError):
        evaluate(text)


def test_division_by_zero_and_huge_values_have_no_value():
    assert evaluate("4 / (2 - 2)").failure == "division by zero"
    assert evaluate("4 / (2 - 2)").value is None
    huge = evaluate("999999 * 999999 * 999999")
    assert huge.value is None and huge.failure == "number too large"


def test_score_is_one_for_correct_a_tenth_for_right_numbers_else_zero():
    numbers, target = (3, 5, 7), 22
    assert score(evaluate("3 * 5 + 7"), numbers, target) == 1.0
    assert score(evaluate("7 * 5 - 3"), numbers, target) == 0.1
    assert score(evaluate("3 * 5 + 7 + 0"), numbers, target) == 0.0  # an extra number
    assert score(evaluate("3 * 5 + 7 * 1"), numbers, target) == 0.0
    assert score(evaluate("15 + 7"), numbers, target) == 0.0  # right value, wrong numbers
    assert score(evaluate("7 / (5 - 5) + 3"), (3, 5, 5, 7), target) == 0.0


def test_generated_instances_are_pinned_and_their_solutions_are_correct():
    first = generate_instance(0)
    assert (first.numbers, first.target, first.solution) == ((13, 1, 67), 54, "67 - (13 * 1)")
    for seed in range(300):
        instance = generate_instance(seed)
        assert 3 <= len(instance.numbers) <= 4
        assert all(1 <= n <= 99 for n in instance.numbers)
        assert 1 <= instance.target <= 100
        evaluation = evaluate(instance.solution)
        assert score(evaluation, instance.numbers, instance.target) == 1.0


def test_seeds_give_different_instances_of_both_sizes():
    instances = [generate_instance(seed) for seed in range(100)]
    assert len({(i.numbers, i.target) for i in instances}) >= 95
    assert {len(i.numbers) for i in instances} == {3, 4}


def test_env_rewards_and_ends():
    env = envs.make("countdown")
    assert env.reset(0) == "Numbers: [13, 1, 67]\nTarget: 54"
    result = env.step("67 - 13 * 1")
    assert result.reward == 1.0 and result.terminated and result.info["success"]
    env.reset(0)
    result = env.step("67 + 13 - 1")
    assert result.reward == 0.1 and result.terminated and not result.info["success"]
    env.reset(0)
    result = env.step("67 \N{MINUS SIGN} 13 \N{MULTIPLICATION SIGN} 1")
    assert result.reward == 1.0 and result.info["success"]
    env.reset(0)
    result = env.step("67 / (13 - 13)")
    assert result.reward == 0.0 and result.info["failure"] == "division by zero"


def test_text_that_is_not_an_expression_is_a_no_op_until_the_budget_ends():
    env = CountdownEnv(max_actions=2)
    first = env.reset(0)
    result = env.step("I think the answer is 54")
    assert result.observation == first and result.reward == 0.0
    assert not result.info["action_valid"] and not result.done
    assert "unexpected character" in result.info["error"]
    assert env.step("no idea").truncated


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_numbers": 1}, r"min_numbers must be between 2 and 6, got 1"),
        ({"min_numbers": 4, "max_numbers": 3}, r"max_numbers \(with min_numbers=4\) must be"),
        ({"max_number": 0}, r"max_number must be between 1 and"),
        ({"max_target": 0}, r"max_target must be between 1 and"),
        # a count that would keep drawing for minutes is refused before any draw
        ({"max_tries": 10**9}, r"max_tries must be between 1 and 10000, got 1000000000"),
    ],
)
def test_bad_options_raise_value_errors_that_say_what_is_allowed(options, message):
    with pytest.raises(ValueError, match=message):
        CountdownEnv(**options)


def test_an_impossible_target_range_raises_after_bounded_tries():
    # Random four-number expressions rarely come to exactly 1: five draws at seed 0 do not.
    with pytest.raises(GenerationError, match="max_tries=5"):
        generate_instance(0, min_numbers=4, max_target=1, max_tries=5)
