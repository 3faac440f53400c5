"""The prompt-cost table: a once-stated format rule saves its tokens on every turn but the
first, no more and no less."""

import pytest

from experiments.prompt_tokens import dialogue_tokens

RULE = "\nAlways reply as <think>...</think><answer>...</answer>."


def test_the_rule_stated_once_saves_its_tokens_on_every_later_turn(tokenizer):
    every = dialogue_tokens(tokenizer, "frozen-lake", "every_turn", 4)
    once = dialogue_tokens(tokenizer, "frozen-lake", "first_turn", 4)
    assert once["turns_mean"] == every["turns_mean"]  # the expert plays the same moves
    rule = len(tokenizer(RULE, add_special_tokens=False)["input_ids"])
    saved = every["tokens_mean"] - once["tokens_mean"]
    assert saved == pytest.approx((every["turns_mean"] - 1) * rule)
