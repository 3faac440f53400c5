"""The shared sampling rule: greedy, temperature, top-p, Gumbel-max by block then token."""

from __future__ import annotations

import torch

from ragen.rollout.sampling import _BLOCK, choose, gumbel_max_in_blocks, row_generators


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


def test_choose_draws_block_then_token_from_each_row_generator():
    vocab = 3 * _BLOCK + 17  # (B, V): several blocks, the last one short
    logits = torch.randn(6, vocab) * 4
    tokens, logprobs = choose(logits, row_generators(5, range(6)), 0.7, 1.0)
    expected_lp = torch.log_softmax(logits / 0.7, -1)
    for row, g in enumerate(row_generators(5, range(6))):
        noise = torch.rand(4 + _BLOCK, generator=g)  # 4 blocks, then the tokens of one
        gumbel = -torch.log(-torch.log(noise))
        lp = expected_lp[row].double()
        masses = [lp[b * _BLOCK : (b + 1) * _BLOCK].exp().sum() for b in range(4)]
        block = int(torch.argmax(torch.stack(masses).log() + gumbel[:4]))
        inside = lp[block * _BLOCK : (block + 1) * _BLOCK]
        token = block * _BLOCK + int(torch.argmax(inside + gumbel[4 : 4 + len(inside)]))
        assert tokens[row] == token
        assert abs(logprobs[row] - expected_lp[row, token]) < 1e-5


def test_gumbel_max_in_blocks_samples_the_weights_across_blocks():
    # A common token alone in block 0; block 1 shares the same mass among all its tokens;
    # block 2 is short (padded) with one token of zero weight that must never come out.
    weights = torch.zeros(1, 2 * _BLOCK + 10)
    weights[0, 3] = 1.0
    weights[0, _BLOCK : 2 * _BLOCK] = 1.0 / _BLOCK
    weights[0, 2 * _BLOCK : 2 * _BLOCK + 9] = 2.0 / 9
    n = 4000
    tokens = gumbel_max_in_blocks(weights.expand(n, -1), row_generators(7, range(n)))
    assert weights[0, tokens].gt(0).all()
    assert tokens[tokens < _BLOCK].eq(3).all()
    share = torch.bincount(tokens // _BLOCK, minlength=3) / n
    assert torch.allclose(share, torch.tensor([0.25, 0.25, 0.5]), atol=0.03)
    # Inside block 1 the draw is uniform over its 256 tokens: no token takes a big share.
    inside = torch.bincount(tokens[tokens // _BLOCK == 1] - _BLOCK, minlength=_BLOCK)
    assert inside.max() < 20 and (inside > 0).sum() > 200
