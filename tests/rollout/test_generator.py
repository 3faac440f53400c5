"""Generation backends: the cached ``hf`` path against the ``naive`` model.generate reference.

Real models only: the tiny random Llama for multi-turn cache bookkeeping, the embedded
SmolLM2 for chat-templated dialogues. Greedy tokens must match exactly.
"""

from __future__ import annotations

import torch

from ragen.rollout.generator import (
    Stopper,
    choose,
    row_generators,
)

LOGPROB_TOL = 1e-4


def test_stopper_rules(tiny):
    _, tokenizer = tiny
    stopper = Stopper(tokenizer, {tokenizer.eos_token_id}, ("</answer>",))
    ids = tokenizer("<think>go</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
    assert [stopper.done(ids[:n]) for n in range(1, len(ids) + 1)].index(True) == len(ids) - 1
    assert stopper.done([5, tokenizer.eos_token_id])
    assert not stopper.done([5, 6])
    assert stopper.cut([5, 6, 7], 3) == (3, "length")
    assert stopper.cut([5, tokenizer.eos_token_id, 7], 3) == (2, "stop")


def test_choose_greedy_top_p_and_frequencies():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(4000, 4)  # (B, V)
    tokens, logprobs = choose(logits, row_generators(0, 4000), 0.0, 1.0)
    assert tokens.eq(0).all() and torch.allclose(logprobs, probs[0].log())
    tokens, _ = choose(logits, row_generators(0, 4000), 1.0, 1.0)
    freq = torch.bincount(tokens, minlength=4) / 4000
    assert torch.allclose(freq, probs, atol=0.03)
    # top_p 0.8: the smallest top set holding 0.8 is {0, 1}; renormalised to 5/8, 3/8.
    tokens, logprobs = choose(logits, row_generators(1, 4000), 1.0, 0.8)
    freq = torch.bincount(tokens, minlength=4) / 4000
    assert freq[2:].sum() == 0 and abs(freq[0] - 5 / 8) < 0.03
    assert torch.allclose(logprobs.exp(), probs[tokens])  # log-probs before truncation
    tokens, _ = choose(logits * 0.5, row_generators(2, 4000), 0.5, 1.0)  # T rescales logits
    assert torch.allclose(torch.bincount(tokens, minlength=4) / 4000, probs, atol=0.03)
