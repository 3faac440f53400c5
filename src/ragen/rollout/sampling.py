"""The sampling rule both generation backends share: one uniform draw per row and step.

Each row draws from its own ``torch.Generator`` (see :func:`row_generators`), so a row's
sample depends on its logits and its generator only, never on the batch it is decoded in.
The draw inverts the row's cumulative distribution. Inverting costs one uniform number per
row and a few passes over the (B, V) logits; the Gumbel-max rule it replaced drew V numbers
per row, which at 32 rows × 49k vocabulary took longer than the passes themselves (about
25 ms a decode step against 11 ms, measured on this CPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

# Vocabulary entries per block of the two-level inverse CDF (see :func:`inverse_cdf`).
_BLOCK = 256


def row_generators(seed: int, streams: Iterable[int]) -> list[torch.Generator]:
    """One noise generator per stream number, seeded from (seed, stream) and nothing else."""
    # torch's CPU generator keeps only 32 bits of a seed, so (seed, stream) is hashed into 32
    # bits by SeedSequence rather than packed side by side (which would drop the seed).
    states = [
        np.random.SeedSequence([seed % 2**63, stream]).generate_state(1)[0] for stream in streams
    ]
    return [torch.Generator().manual_seed(int(state)) for state in states]


def choose(
    logits: torch.Tensor, generators: Sequence[torch.Generator], temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and its log-prob.

    logits: (B, V); one generator per row. Returns tokens (B,) long and logprobs (B,) float32,
    the log-probs under ``softmax(logits / temperature)`` before any top-p truncation.
    Temperature 0 is argmax (nothing drawn). Otherwise one float64 uniform per row, from the
    row's generator, picks the token by inverting the cumulative distribution of
    ``softmax(logits / temperature)`` restricted to the top-p nucleus.
    """
    scaled = logits.float()
    if temperature > 0:
        scaled = scaled / temperature
    peak = scaled.amax(-1, keepdim=True)  # (B, 1)
    weights = (scaled - peak).exp_()  # (B, V): the probabilities times the row's normaliser
    log_norm = weights.sum(-1, keepdim=True).log_()  # (B, 1)
    if temperature <= 0:
        tokens = scaled.argmax(-1)  # (B,)
    else:
        draws = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators])
        tokens = inverse_cdf(_nucleus(weights, top_p), draws.to(weights.device))
    logprobs = scaled.gather(-1, tokens[:, None]) - peak - log_norm  # (B, 1)
    return tokens, logprobs.squeeze(-1)


def _nucleus(weights: torch.Tensor, top_p: float) -> torch.Tensor:
    """weights (B, V) ≥ 0, zeroed outside the smallest set of top tokens holding ``top_p``."""
    if top_p >= 1.0:
        return weights
    ranked, order = weights.sort(-1, descending=True)  # (B, V)
    cumulative = ranked.cumsum(-1)
    # A token is dropped when the tokens ranked above it already hold top_p (the top one never).
    drop_ranked = cumulative - ranked >= top_p * cumulative[:, -1:]
    drop = drop_ranked.scatter(-1, order, drop_ranked)
    return weights.masked_fill(drop, 0.0)


def inverse_cdf(weights: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """The token of each row where the running sum of ``weights`` first exceeds
    ``draw × total``: a sample from ``weights / total`` for a uniform draw in [0, 1).

    weights: (B, V) ≥ 0 with a positive total per row; draws: (B,) float64 in [0, 1).
    Returns (B,) long; a token of zero weight is never returned.

    A float32 running sum over 49k entries rounds the weights of rare tokens away (an entry
    under half a unit of the sum's last place never moves it), and a float64 running sum is a
    sequential pass that took longer than all of :func:`choose` on this CPU. So the sum is
    taken in two levels, all in float64: the sums of blocks of ``_BLOCK`` entries (a
    vectorised reduction), their running sum, then the running sum inside the one block the
    draw lands in; the sequential passes cover ``V / _BLOCK + _BLOCK`` entries, not V.
    """
    rows, vocab = weights.shape
    n_blocks = -(-vocab // _BLOCK)
    if vocab % _BLOCK:
        weights = torch.nn.functional.pad(weights, (0, n_blocks * _BLOCK - vocab))
    blocks = weights.view(rows, n_blocks, _BLOCK)
    outer = blocks.double().sum(-1).cumsum_(-1)  # (B, n_blocks)
    zero = torch.zeros((), dtype=outer.dtype, device=outer.device)
    # draw × total can round up to the total itself: keep the target zero it, so the first
    # block whose running sum exceeds the target exists and has positive weight.
    target = torch.minimum(draws * outer[:, -1], torch.nextafter(outer[:, -1], zero))  # (B,)
    block = torch.searchsorted(outer, target[:, None], right=True).squeeze(-1)
    before = outer.gather(-1, (block - 1).clamp(min=0)[:, None]).squeeze(-1)  # (B,)
    rest = target - torch.where(block > 0, before, zero)
    inner = blocks[torch.arange(rows, device=weights.device), block].double().cumsum_(-1)
    # The block's float32 sum and its float64 running sum may differ in the last place: keep
    # the remainder zero the running sum's end, so the pick stays on a token of the block
    # with positive weight.
    rest = torch.minimum(rest, torch.nextafter(inner[:, -1], zero))
    return block * _BLOCK + torch.searchsorted(inner, rest[:, None], right=True).squeeze(-1)
