"""Forward passes that score a batch: per-token log-probs and entropy of the policy, values
of the critic. Everything is aligned with the tokens: position t holds the quantity for
token t given tokens < t (position 0, which nothing predicts, holds 0)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ragen.algos import logprobs_and_entropy


def _shift_right(x: torch.Tensor) -> torch.Tensor:
    """(B, T-1) → (B, T) with a zero column in front."""
    return F.pad(x, (1, 0))


def policy_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of each token under ``model``, both (B, T) float32.

    The logits (B, T, V) are the memory hot spot; the log-softmax runs in chunks over
    positions so no second full-size float32 copy is made.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logp, ent = logprobs_and_entropy(
        logits[:, :-1],  # (B, T-1, V): position t-1 predicts token t
        input_ids[:, 1:],
        # greedy replies (temperature 0) carry log-probs at temperature 1, as the generator's
        temperature=temperature if temperature > 0 else 1.0,
        with_entropy=with_entropy,
    )
    return _shift_right(logp), _shift_right(ent)


def critic_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """V(state before token t) for every t, (B, T) float32."""
    values = critic(input_ids, attention_mask).float()  # (B, T): value after each token
    return _shift_right(values[:, :-1])


@torch.no_grad()
def score_batch(
    policy,
    critic,
    ref_logprobs,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float,
    micro_batch: int,
) -> dict[str, torch.Tensor | None]:
    """Old log-probs (and reference log-probs, values) for a whole batch, in micro-batches.

    ``ref_logprobs(ids, mask) -> (B, T)`` scores under the frozen reference; it and
    ``critic`` may be None (no KL term; no critic). Returns (B, T) tensors.
    """
    old, refs, values = [], [], []
    for rows in torch.arange(len(input_ids)).split(micro_batch):
        ids, mask = input_ids[rows], attention_mask[rows]
        old.append(
            policy_logprobs(policy, ids, mask, temperature=temperature, with_entropy=False)[0]
        )
        if ref_logprobs is not None:
            refs.append(ref_logprobs(ids, mask))
        if critic is not None:
            values.append(critic_values(critic, ids, mask))
    return {
        "old_logprobs": torch.cat(old),
        "ref_logprobs": torch.cat(refs) if refs else None,
        "values": torch.cat(values) if values else None,
    }
