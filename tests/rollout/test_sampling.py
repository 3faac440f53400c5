"""The shared sampling rule, tested on what it draws: the distribution of many seeded draws
(greedy, temperature, top-p), exact exclusion outside the nucleus, and reproducibility."""

from __future__ import annotations

import math

import torch

from ragen.rollout.sampling import _BLOCK, choose, gumbel_max_in_blocks, row_generators

VOCAB = 3 * _BLOCK + 17  # several blocks of the two-level draw, the last one short
# A few likely tokens spread over every block (the last one in the short block), over a tail
# of unlikely ones. At T=0.7 the head holds 94% of the mass: 0.405, 0.228, 0.129, 0.097,
# 0.047, 0.023, 0.011; the cumulative mass 0.859 after four tokens, 0.906 after five.
HEAD = {5: 3.0, 260: 2.6, 300: 2.2, 511: 2.0, 530: 1.5, 700: 1.0, 780: 0.5}
DRAWS = 20_000


def _logits() -> torch.Tensor:
    logits = torch.full((VOCAB,), -3.0)
    for token, logit in HEAD.items():
        logits[token] = logit
    return logits  # (V,)


def _bins(per_token: torch.Tensor) -> torch.Tensor:
    """Counts or probabilities (V,) per head token, then the tail's per block."""
    head = torch.tensor(list(HEAD))
    tail = per_token.double().clone()
    tail[head] = 0
    blocks = -(-VOCAB // _BLOCK)
    tail = torch.nn.functional.pad(tail, (0, blocks * _BLOCK - VOCAB)).view(blocks, _BLOCK)
    return torch.cat([per_token.double()[head], tail.sum(-1)])  # (len(HEAD) + blocks,)


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """Pearson's statistic of the draws against ``probs`` (V,) over the bins of `_bins`, and
    the bound a correct sampler exceeds with probability 1e-6: the chi-square quantile by
    Wilson and Hilferty's cube-root approximation (a few percent at these degrees of freedom)."""
    observed = _bins(torch.bincount(tokens, minlength=VOCAB))
    expected = _bins(probs) * len(tokens)
    used = expected > 0
    assert observed[~used].sum() == 0  # nothing drawn where nothing is expected
    assert expected[used].min() >= 5  # the chi-square approximation holds
    statistic = float(((observed[used] - expected[used]) ** 2 / expected[used]).sum())
    df = int(used.sum()) - 1
    z = 4.753  # standard normal quantile of 1 - 1e-6
    bound = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return statistic, bound


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition, in float64: the fewest most likely tokens whose mass reaches top_p."""
    ranked, order = probs.double().sort(descending=True)
    size = int((ranked.cumsum(0) < top_p).sum()) + 1
    keep = torch.zeros(len(probs), dtype=torch.bool)
    keep[order[:size]] = True
    return keep


def _draw(temperature: float, top_p: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _logits().expand(DRAWS, VOCAB)  # (B, V): one row per draw, each its own stream
    return choose(logits, row_generators(seed, range(DRAWS)), temperature, top_p)


def test_draws_follow_the_tempered_softmax():
    tokens, logprobs = _draw(0.7, 1.0)
    expected = torch.softmax(_logits().double() / 0.7, -1)
    statistic, bound = _chi_square(tokens, expected)
    assert statistic < bound, (statistic, bound)
    # The same draws are far from what the wrong temperature would give: the test can fail.
    assert _chi_square(tokens, torch.softmax(_logits().double(), -1))[0] > 10 * bound
    # Each draw's log-prob is its token's under softmax(logits / T).
    assert torch.allclose(logprobs.double(), expected.log()[tokens], atol=1e-5)


def test_top_p_draws_only_the_nucleus_in_its_renormalised_proportions():
    probs = torch.softmax(_logits().double() / 0.7, -1)
    keep = _nucleus(probs, 0.88)
    assert keep.sum() == 5  # cumulative mass 0.859 after four tokens, 0.906 after five
    tokens, logprobs = _draw(0.7, 0.88, seed=1)
    assert keep[tokens].all()  # not one draw outside the nucleus
    assert set(tokens.tolist()) == set(keep.nonzero().flatten().tolist())  # all of it drawn
    inside = torch.where(keep, probs, 0.0)
    statistic, bound = _chi_square(tokens, inside / inside.sum())
    assert statistic < bound, (statistic, bound)
    # Log-probs are those before the truncation (what PPO's ratio compares with).
    assert torch.allclose(logprobs.double(), probs.log()[tokens], atol=1e-5)


def test_temperature_zero_is_argmax_and_draws_nothing():
    logits = torch.randn(16, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    generators = row_generators(0, range(16))
    states = [g.get_state() for g in generators]
    tokens, logprobs = choose(logits, generators, 0.0, 0.5)
    assert torch.equal(tokens, logits.argmax(-1))
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(logprobs, expected, atol=1e-5)
    assert all(torch.equal(g.get_state(), s) for g, s in zip(generators, states, strict=True))


def test_a_row_draws_the_same_whatever_its_batch_and_the_seed_decides():
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(4))  # (B, V)
    tokens, _ = choose(logits, row_generators(9, range(8)), 1.0, 0.95)
    again, _ = choose(logits, row_generators(9, range(8)), 1.0, 0.95)
    assert torch.equal(tokens, again)
    # Row 5 alone, with its own stream, draws what it drew among the others.
    alone, _ = choose(logits[5:6], row_generators(9, [5]), 1.0, 0.95)
    assert alone.item() == tokens[5].item()
    # Another seed draws independently: two independent draws from p differ with
    # probability 1 - sum(p^2) (0.76 here), within 5 standard errors over 20,000 rows.
    first, _ = _draw(0.7, 1.0, seed=0)
    other, _ = _draw(0.7, 1.0, seed=2)
    p = torch.softmax(_logits().double() / 0.7, -1)
    differ = float(1 - (p * p).sum())
    assert abs(float((first != other).double().mean()) - differ) < 5 * math.sqrt(
        differ * (1 - differ) / DRAWS
    )


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
