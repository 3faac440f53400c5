"""The shared sampling rule: greedy, temperature, top-p, one draw per row, exact inversion."""

from __future__ import annotations

import torch

from ragen.rollout.sampling import _BLOCK, choose, inverse_cdf, row_generators


def test_choose_greedy_top_p_and_frequencies():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(4000, 4)  # (B, V)
    tokens, logprobs = choose(logits, row_generators(0, range(4000)), 0.0, 1.0)
    assert tokens.eq(0).all() and torch.allclose(logprobs, probs[0].log())
    tokens, _ = choose(logits, row_generators(0, range(4000)), 1.0, 1.0)
    freq = torch.bincount(tokens, minlength=4) / 4000
    assert torch.allclose(freq, probs, atol=0.03)
    # top_p 0.8: the smallest top set holding 0.8 is {0, 1}; renormalised to 5/8, 3/8.
    tokens, logprobs = choose(logits, row_generators(1, range(4000)), 1.0, 0.8)
    freq = torch.bincount(tokens, minlength=4) / 4000
    assert freq[2:].sum() == 0 and abs(freq[0] - 5 / 8) < 0.03
    assert torch.allclose(logprobs.exp(), probs[tokens])  # log-probs before truncation
    tokens, _ = choose(logits * 0.5, row_generators(2, range(4000)), 0.5, 1.0)  # T rescales logits
    assert torch.allclose(torch.bincount(tokens, minlength=4) / 4000, probs, atol=0.03)


def test_choose_inverts_the_cdf_with_one_draw_from_each_row_generator():
    logits = torch.randn(6, 3 * _BLOCK + 17) * 4  # (B, V): several blocks, the last one short
    tokens, logprobs = choose(logits, row_generators(5, range(6)), 0.7, 1.0)
    expected_lp = torch.log_softmax(logits / 0.7, -1)
    for row, g in enumerate(row_generators(5, range(6))):
        draw = torch.rand(1, generator=g, dtype=torch.float64).item()
        cdf = expected_lp[row].double().exp().cumsum(0)
        expected = int((cdf > draw * cdf[-1]).nonzero()[0])  # first token past the draw
        assert tokens[row] == expected
        assert abs(logprobs[row] - expected_lp[row, expected]) < 1e-5


def test_inverse_cdf_lands_on_the_right_token_at_block_edges():
    weights = torch.zeros(1, 2 * _BLOCK + 88)  # (1, V): the last block is short and padded
    for token, weight in [(5, 1.0), (_BLOCK - 1, 2.0), (_BLOCK, 3.0), (2 * _BLOCK + 3, 4.0)]:
        weights[0, token] = weight
    cases = {  # draw → token; the running sum is 1, 3, 6, 10 and the draw picks the first > draw×10
        0.0: 5,
        0.05: 5,
        0.1: _BLOCK - 1,  # exactly on a running-sum value: the next token
        0.35: _BLOCK,
        0.65: 2 * _BLOCK + 3,
        1 - 2**-53: 2 * _BLOCK + 3,  # the largest draw never runs past the last positive token
    }
    for draw, token in cases.items():
        assert inverse_cdf(weights, torch.tensor([draw], dtype=torch.float64)).item() == token


def test_inverse_cdf_tells_apart_rare_tokens_a_float32_running_sum_lumps_together():
    # One common token, then 1e-9 on every other: past the common one a float32 running sum
    # moves only every hundred tokens or so (its last place near 1.0 is 1.2e-7), so of each
    # run of rare tokens one takes the run's whole mass and the others can never be drawn.
    vocab = 48 * _BLOCK
    weights = torch.full((1, vocab), 1e-9)
    weights[0, 0] = 1.0
    float32_cdf = weights.cumsum(-1)[0]
    assert (float32_cdf[1:] == float32_cdf[:-1]).sum() > vocab * 0.9
    exact_cdf = weights[0].double().cumsum(0)
    draws = torch.tensor([0.99999, 0.999995, 0.999999], dtype=torch.float64)
    tokens = inverse_cdf(weights.expand(3, vocab), draws)
    lumped = torch.searchsorted(float32_cdf, (draws * float32_cdf[-1]).float(), right=True)
    for draw, token, float32_token in zip(draws, tokens, lumped, strict=True):
        expected = int((exact_cdf > draw * exact_cdf[-1]).nonzero()[0])
        assert token == expected and 0 < expected < vocab
        assert float32_token != expected
