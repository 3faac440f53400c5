"""What every engine shares: the stop rule and the checks of a call."""

from __future__ import annotations

import pytest

from ragen.rollout.engines import Request, Stopper, make_generator


def test_stopper_rules(tiny):
    _, tokenizer = tiny
    stopper = Stopper(tokenizer, {tokenizer.eos_token_id}, ("</answer>",))
    ids = tokenizer("<think>go</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
    assert [stopper.done(ids[:n]) for n in range(1, len(ids) + 1)].index(True) == len(ids) - 1
    assert stopper.done([5, tokenizer.eos_token_id])
    assert not stopper.done([5, 6])
    assert stopper.cut([5, 6, 7], 3) == (3, "length")
    assert stopper.cut([5, tokenizer.eos_token_id, 7], 3) == (2, "stop")


def test_bad_calls_say_what_to_do(tiny):
    model, tokenizer = tiny
    gen = make_generator("hf", model, tokenizer)
    with pytest.raises(ValueError, match="share a key"):
        gen.generate([Request(1, [5]), Request(1, [6])], max_new_tokens=2, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        gen.generate([Request(1, [5])], max_new_tokens=2, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="no context"):
        gen.generate([Request(1, [])], max_new_tokens=2, temperature=0.0)
    assert gen.generate([], max_new_tokens=2, temperature=0.0) == []
