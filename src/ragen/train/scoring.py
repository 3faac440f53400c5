"""Forward passes that score a batch: per-token log-probs and entropy of the policy, values
of the critic. Everything is aligned with the tokens: position t holds the quantity for
token t given tokens < t (position 0, which nothing predicts, holds 0)."""

from __future__ import annotations

import torch

from ragen.train import forward
from ragen.train.fsdp import root_forward

__all__ = [
    "critic_values",
    "policy_logprobs",
    "policy_logprobs_and_values",
    "reads_policy_pass",
    "score_batch",
]

# The scorers live in forward.py (shared prefix once, LM head on sampled positions only);
# these are the names the loop and the update use, run as a forward of a sharded model.
critic_values = root_forward(forward.state_values)
policy_logprobs = root_forward(forward.token_logprobs)
policy_logprobs_and_values = root_forward(forward.logprobs_and_trunk_values)


def reads_policy_pass(policy, critic) -> bool:
    """Whether ``critic``'s values come from ``policy``'s own pass: a head on its trunk
    (``critic.detached_body``) where the policy runs anyway."""
    return policy is not None and critic is not None and critic.detached_body


@torch.no_grad()
def score_batch(
    policy,
    critic,
    ref_logprobs,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    temperature: float,
    micro_batch: int,
    share_opening: bool = False,
) -> dict[str, torch.Tensor | None]:
    """Old log-probs (and reference log-probs, values) for a whole batch, in micro-batches.

    ``ref_logprobs(ids, mask, loss_mask) -> (B, T)`` scores under the frozen reference; it,
    ``policy`` and ``critic`` may be None (no KL term; old log-probs or values left to the
    update; no critic), and so is their entry. A critic that is a head on the policy's trunk
    reads the policy's pass (``reads_policy_pass``). Returns (B, T) tensors.
    ``share_opening``: run the opening all rows share once for the batch rather than once per
    micro-batch (models that are not sharded).
    """
    old, refs, values = [], [], []
    one_pass = reads_policy_pass(policy, critic)
    policy_opening = critic_opening = None
    if share_opening and len(input_ids):
        if policy is not None:
            policy_opening = forward.SharedOpening(policy.get_decoder(), input_ids, attention_mask)
        if critic is not None and not one_pass:
            critic_opening = forward.critic_opening(critic, input_ids, attention_mask)
    for rows in torch.arange(len(input_ids)).split(micro_batch):
        ids, mask, sampled = input_ids[rows], attention_mask[rows], loss_mask[rows]
        if policy is not None:
            logp, _, v = policy_logprobs_and_values(
                policy,
                critic if one_pass else None,
                ids,
                mask,
                sampled,
                temperature=temperature,
                with_entropy=False,
                opening=policy_opening,
            )
            old.append(logp)
            if v is not None:
                values.append(v)
        if ref_logprobs is not None:
            refs.append(ref_logprobs(ids, mask, sampled))
        if critic is not None and not one_pass:
            values.append(critic_values(critic, ids, mask, critic_opening))

    def joined(parts: list[torch.Tensor]) -> torch.Tensor:
        # no rows at all (a data-parallel rank's share of a small batch): (0, T) zeros
        return torch.cat(parts) if parts else torch.zeros(input_ids.shape, device=input_ids.device)

    return {
        "old_logprobs": joined(old) if policy is not None else None,
        "ref_logprobs": joined(refs) if ref_logprobs is not None else None,
        "values": joined(values) if critic is not None else None,
    }
