"""Training forward passes that skip work the loss never reads.

Two savings, both exact up to float rounding:

- Shared prefix. The episodes of a batch open with the same tokens (system line, worked
  examples, the game's rules), often most of each row: on Bandit with two worked turns,
  about 440 of 490 tokens. The decoder runs that prefix once, for one row, and the rows
  continue from its KV cache, expanded to the batch. Autograd sums the rows' gradients
  through the expansion, so the gradient is the one the full batch would give.
- Sampled positions only. Log-probs are needed where the next token was sampled (the loss
  mask), so the LM head (hidden x vocabulary, 49k wide on the default model) and the
  log-softmax run on those positions only, not on every prompt token.

Shapes: B rows, T positions, H hidden size, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ragen.algos import logprobs_and_entropy

# Below this many shared tokens the extra prefix call costs more than it saves.
MIN_SHARED_PREFIX = 16


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Tokens every row starts with, leaving each row at least one token of its own.

    input_ids, attention_mask: (B, T), right-padded (real tokens first in every row).
    Returns 0 when sharing would not pay (one row, or fewer than MIN_SHARED_PREFIX tokens).
    """
    if len(input_ids) < 2:
        return 0
    lengths = attention_mask.sum(dim=1)
    same = (input_ids == input_ids[:1]).all(dim=0)  # (T,): column equal in every row
    differs = (~same).nonzero()
    common = int(differs[0]) if len(differs) else input_ids.shape[1]
    common = min(common, int(lengths.min()) - 1)
    return common if common >= MIN_SHARED_PREFIX else 0


def decoder_hidden(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states (B, T, H) of a decoder body (e.g. LlamaModel), the shared prefix
    computed once."""
    prefix = shared_prefix_length(input_ids, attention_mask)
    if prefix == 0:
        return decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
    rows = len(input_ids)
    cache = DynamicCache(config=decoder.config)
    head = decoder(input_ids=input_ids[:1, :prefix], past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(rows)
    tail = decoder(
        input_ids=input_ids[:, prefix:],
        attention_mask=attention_mask,  # the whole row's mask: prefix and own tokens
        past_key_values=cache,
        use_cache=True,
    )
    shared = head.last_hidden_state.expand(rows, -1, -1)
    return torch.cat([shared, tail.last_hidden_state], dim=1)


def _next_token_positions(loss_mask: torch.Tensor | None, input_ids: torch.Tensor):
    """(rows, cols) of positions t whose next token t+1 is scored: sampled ones, or all."""
    wanted = torch.zeros_like(input_ids, dtype=torch.bool)
    if loss_mask is None:
        wanted[:, :-1] = True
    else:
        wanted[:, :-1] = loss_mask[:, 1:] > 0
    return wanted.nonzero(as_tuple=True)


def _head_logits(lm, hidden: torch.Tensor) -> torch.Tensor:
    """LM head on selected hidden states (N, H) → logits (N, V), with the final soft cap
    some families (Gemma 2) apply after the head."""
    logits = lm.get_output_embeddings()(hidden)
    cap = getattr(lm.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def token_logprobs(
    lm,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of each scored token under causal LM ``lm``, both (B, T) float32.

    Position t holds the quantity for token t given tokens < t. Only positions with
    ``loss_mask`` 1 are scored (all but position 0 when it is None); the rest hold 0.
    ``temperature`` 0 (greedy replies) scores at 1, as the generator reports them.
    """
    temperature = temperature if temperature > 0 else 1.0
    hidden = decoder_hidden(lm.get_decoder(), input_ids, attention_mask)  # (B, T, H)
    rows, cols = _next_token_positions(loss_mask, input_ids)
    logits = _head_logits(lm, hidden[rows, cols])  # (N, V)
    logp, ent = logprobs_and_entropy(
        logits[None],
        input_ids[rows, cols + 1][None],
        temperature=temperature,
        with_entropy=with_entropy,
    )
    out_logp = torch.zeros(input_ids.shape, dtype=logp.dtype, device=logp.device)
    out_ent = torch.zeros_like(out_logp)
    # index_put keeps the graph: gradients flow back to the scored positions only
    out_logp = out_logp.index_put((rows, cols + 1), logp[0])
    out_ent = out_ent.index_put((rows, cols + 1), ent[0])
    return out_logp, out_ent


def state_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """V(state before token t) for every t, (B, T) float32 (position 0 holds 0).

    ``critic`` is a `models.ValueModel`: its decoder body, then its scalar head.
    """
    hidden = decoder_hidden(critic.body, input_ids, attention_mask)
    values = critic.head(hidden.to(critic.head.weight.dtype)).squeeze(-1).float()  # (B, T)
    return F.pad(values[:, :-1], (1, 0))
