"""Training forward passes that skip work the loss never reads.

Two savings, both exact up to float rounding:

- Shared prefix. The episodes of a batch open with the same tokens (system line, worked
  examples, the game's rules), often most of each row: on Bandit with two worked turns,
  about 440 of 490 tokens. The decoder runs that prefix once, for one row, and the rows
  continue from its KV cache, expanded to the batch. Autograd sums the rows' gradients
  through the expansion, so the gradient is the one the full batch would give. A
  ``SharedOpening`` runs it once for all the micro-batches of a mini-batch and takes its
  backward once, after the last of them.
- Sampled positions only. Log-probs are needed where the next token was sampled (the loss
  mask), so the LM head (hidden x vocabulary, 49k wide on the default model) and the
  log-softmax run on those positions only, not on every prompt token.

Shapes: B rows, T positions, H hidden size, V vocabulary.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ragen.algos import logprobs_and_entropy
from ragen.models.kv_keyword import cache_kwarg

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


class SharedOpening:
    """The tokens every row of a mini-batch opens with, run once through ``decoder`` for all
    its micro-batches.

    Its hidden states and per-layer keys/values enter each micro-batch's forward as leaf
    tensors: a micro-batch's backward stops at them and adds into their ``.grad``. After the
    last micro-batch, ``backward()`` runs the opening's own backward once, from those summed
    gradients: the gradient the micro-batches would give if each ran the opening itself, for
    one opening's compute instead of one per micro-batch. Under ``torch.no_grad`` (scoring)
    it is a plain cache and ``backward()`` does nothing.

    input_ids, attention_mask: (B, T) of the whole mini-batch, right-padded. ``length`` is 0
    when the rows share too little (``shared_prefix_length``) or the decoder's cache layers
    are not plain ones (sliding windows crop what they keep): the micro-batches then run
    their own shared prefix, as ``decoder_hidden`` does without one.
    """

    def __init__(self, decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        self.decoder = decoder
        self.length = shared_prefix_length(input_ids, attention_mask)
        self._outputs: list[torch.Tensor] = []
        self._leaves: list[torch.Tensor] = []
        if self.length == 0:
            return
        cache = DynamicCache(config=decoder.config)
        opening = input_ids[:1, : self.length]
        head = decoder(input_ids=opening, **cache_kwarg(decoder, cache), use_cache=True)
        layers = [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]
        if any(type(layer) is not DynamicLayer for layer in cache.layers):
            self.length = 0
            return
        self._outputs = [head.last_hidden_state]  # (1, P, H)
        for layer in layers:
            assert layer.keys is not None and layer.values is not None  # filled by the forward
            self._outputs += [layer.keys, layer.values]  # (1, H_kv, P, D) each
        # float32 leaves: the micro-batches' gradients add up in float32 even when the forward
        # runs in bf16 (autocast), and each micro-batch casts them to what it computes in
        grad = torch.is_grad_enabled()
        self._leaves = [t.detach().float().requires_grad_(grad) for t in self._outputs]

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Last hidden states (B, T, H) of rows of the mini-batch: the opening's, then the
        rows' own tokens continued from its keys/values."""
        rows, prefix = len(input_ids), self.length
        cache = DynamicCache(config=self.decoder.config)
        keys_values = self._leaves[1:]
        dtypes = [t.dtype for t in self._outputs[1:]]
        for layer in range(len(keys_values) // 2):
            keys = keys_values[2 * layer].to(dtypes[2 * layer])
            values = keys_values[2 * layer + 1].to(dtypes[2 * layer + 1])
            cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), layer)
        tail = self.decoder(
            input_ids=input_ids[:, prefix:],
            attention_mask=attention_mask,  # the whole row's mask: opening and own tokens
            **cache_kwarg(self.decoder, cache),
            use_cache=True,
        )
        shared = self._leaves[0].to(self._outputs[0].dtype).expand(rows, -1, -1)
        return torch.cat([shared, tail.last_hidden_state], dim=1)

    def backward(self) -> None:
        """The opening's backward, from the gradients the micro-batches left on its outputs;
        then its graph and tensors are released."""
        pairs = [(o, leaf.grad) for o, leaf in zip(self._outputs, self._leaves, strict=True)]
        pairs = [(o, g.to(o.dtype)) for o, g in pairs if g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self._outputs, self._leaves, self.length = [], [], 0


def decoder_hidden(
    decoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    opening: SharedOpening | None = None,
) -> torch.Tensor:
    """Last hidden states (B, T, H) of a decoder body (e.g. LlamaModel), the shared prefix
    computed once: once for these rows, or once for their mini-batch when ``opening`` (of
    this decoder, over a mini-batch these rows belong to) is given."""
    if opening is not None and opening.length:
        return opening.hidden(input_ids, attention_mask)
    prefix = shared_prefix_length(input_ids, attention_mask)
    if prefix == 0:
        return decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
    rows = len(input_ids)
    cache = DynamicCache(config=decoder.config)
    head = decoder(input_ids=input_ids[:1, :prefix], **cache_kwarg(decoder, cache), use_cache=True)
    cache.batch_repeat_interleave(rows)
    tail = decoder(
        input_ids=input_ids[:, prefix:],
        attention_mask=attention_mask,  # the whole row's mask: prefix and own tokens
        **cache_kwarg(decoder, cache),
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
    opening: SharedOpening | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of each scored token under causal LM ``lm``, both (B, T) float32.

    Position t holds the quantity for token t given tokens < t. Only positions with
    ``loss_mask`` 1 are scored (all but position 0 when it is None); the rest hold 0.
    ``temperature`` 0 (greedy replies) scores at 1, as the generator reports them.
    ``opening``: the rows' mini-batch opening, of ``lm``'s decoder (see ``SharedOpening``).
    """
    logp, ent, _ = logprobs_and_trunk_values(
        lm,
        None,
        input_ids,
        attention_mask,
        loss_mask,
        temperature=temperature,
        with_entropy=with_entropy,
        opening=opening,
    )
    return logp, ent


def logprobs_and_trunk_values(
    lm,
    critic,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    opening: SharedOpening | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``token_logprobs``, and the ``state_values`` of ``critic``, a head on ``lm``'s own
    decoder (``critic.detached_body``, `models.TrunkValueHead`), from one decoder pass: the
    head reads the very hidden states the log-probs come from, detached, where a separate
    ``state_values`` would run the decoder again for the same numbers. ``critic`` None: the
    values are None. All (B, T) float32.
    """
    decoder = lm.get_decoder()
    assert critic is None or (critic.detached_body and critic.body is decoder), "lm's own head"
    hidden = decoder_hidden(decoder, input_ids, attention_mask, opening)  # (B, T, H)
    temperature = temperature if temperature > 0 else 1.0
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
    values = None if critic is None else _head_values(critic, hidden.detach())
    return out_logp, out_ent, values


def _body_grad(critic):
    """No gradient through a critic's body that is not its own to train (``detached_body``)."""
    return torch.no_grad() if critic.detached_body else nullcontext()


def critic_opening(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SharedOpening:
    """The shared opening of ``critic.body`` over a mini-batch (see ``SharedOpening``); without
    a graph when the body is read without gradient."""
    with _body_grad(critic):
        return SharedOpening(critic.body, input_ids, attention_mask)


def state_values(
    critic,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    opening: SharedOpening | None = None,
) -> torch.Tensor:
    """V(state before token t) for every t, (B, T) float32 (position 0 holds 0).

    ``critic`` is a `models.ValueModel` or `models.TrunkValueHead`: its decoder body (without
    gradient for the latter), then its scalar head. ``opening``: the rows' mini-batch opening,
    of ``critic.body`` (``critic_opening``).
    """
    with _body_grad(critic):
        hidden = decoder_hidden(critic.body, input_ids, attention_mask, opening)
    return _head_values(critic, hidden)


def _head_values(critic, hidden: torch.Tensor) -> torch.Tensor:
    """``state_values`` of the critic body's last hidden states (B, T, H)."""
    # Outside autocast: under bf16 autocast the head would round every value (and so the
    # returns, the GAE targets and the value clip) to bf16's 3 significant digits.
    with torch.autocast(hidden.device.type, enabled=False):
        values = critic.head(hidden.to(critic.head.weight.dtype)).squeeze(-1).float()  # (B, T)
    return F.pad(values[:, :-1], (1, 0))
