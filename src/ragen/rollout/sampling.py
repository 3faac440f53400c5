"""The sampling rule both generation backends share: Gumbel-max in two levels.

Each row draws from its own ``torch.Generator`` (see :func:`row_generators`), so a row's
sample depends on its logits and its generator only, never on the batch it is decoded in.
Gumbel-max (the argmax of log-probability plus Gumbel noise) drawn over the whole vocabulary
takes V numbers per row and step, a visible share of a decode step. The vocabulary is cut
into blocks instead: Gumbel-max over the blocks' log-masses picks a block, Gumbel-max inside
it picks the token, the same distribution (P(token) = P(block) · P(token | block)) from
``V / _BLOCK + _BLOCK`` numbers per row (docs/performance.md has the timings). It keeps what
makes Gumbel-max robust: the pick changes only where two perturbed scores tie to within the
logits' rounding, so two backends whose logits differ in the last bits still sample the same
tokens. (Inverting the cumulative distribution with one number would be cheaper still, but in
the long tail of tiny probabilities a shift of the running sum by rounding moves the pick to
a neighbouring token, and the ``hf`` and ``naive`` backends would play different episodes.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

# Vocabulary entries per block of the two-level Gumbel-max (see :func:`gumbel_max_in_blocks`).
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
    Temperature 0 is argmax (nothing drawn). Otherwise :func:`gumbel_max_in_blocks` samples
    ``softmax(logits / temperature)`` restricted to the top-p nucleus.
    """
    scaled = logits.float()  # (B, V)
    if temperature > 0 and temperature != 1:
        scaled = scaled / temperature
    # One fused pass; the log of a float32 probability keeps ~1e-7 of relative precision,
    # which is all a log-prob needs (tokens as unlikely as 1e-38 are never drawn).
    probs = torch.softmax(scaled, -1)  # (B, V)
    if temperature <= 0:
        tokens = scaled.argmax(-1)  # (B,)
    else:
        tokens = gumbel_max_in_blocks(_nucleus(probs, top_p), generators)
    logprobs = probs.gather(-1, tokens[:, None]).log_()  # (B, 1)
    return tokens, logprobs.squeeze(-1)


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs (B, V), zeroed outside the smallest set of top tokens holding ``top_p``."""
    if top_p >= 1.0:
        return probs
    ranked, order = probs.sort(-1, descending=True)  # (B, V)
    # A token is dropped when the tokens ranked above it already hold top_p (the top one never).
    drop_ranked = ranked.cumsum(-1) - ranked >= top_p
    drop = drop_ranked.scatter(-1, order, drop_ranked)
    return probs.masked_fill(drop, 0.0)


def gumbel_max_in_blocks(
    weights: torch.Tensor, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """A sample from ``weights / weights.sum()`` per row, by Gumbel-max over blocks of
    ``_BLOCK`` tokens, then over the tokens of the chosen block.

    weights: (B, V) ≥ 0 with a positive sum per row; one generator per row, which gives
    ``ceil(V / _BLOCK) + _BLOCK`` uniform numbers per call. Returns (B,) long; a token of
    zero weight is never returned. Block masses are float32 sums: beside a common token, a
    rare one under half a unit of its last place rounds away: a block may lose 255 of them,
    1.5e-5 of its mass at most. A float64 sum would cost a copy of the whole (B, V).
    """
    rows, vocab = weights.shape
    n_blocks = -(-vocab // _BLOCK)
    if vocab % _BLOCK:
        weights = torch.nn.functional.pad(weights, (0, n_blocks * _BLOCK - vocab))
    blocks = weights.view(rows, n_blocks, _BLOCK)
    noise = torch.empty(rows, n_blocks + _BLOCK)  # (B, n_blocks + _BLOCK)
    # CPU generators, so the noise (and the sample) is the same whatever the device.
    for row, g in zip(noise, generators, strict=True):
        row.uniform_(generator=g)
    gumbel = noise.to(weights.device).log_().neg_().log_().neg_()  # -log(-log(U))
    block_mass = blocks.sum(-1)  # (B, n_blocks)
    block = (block_mass.log() + gumbel[:, :n_blocks]).argmax(-1)  # (B,)
    inside = blocks[torch.arange(rows, device=weights.device), block]  # (B, _BLOCK)
    return block * _BLOCK + (inside.log() + gumbel[:, n_blocks:]).argmax(-1)
