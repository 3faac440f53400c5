"""Template collapse (RAGEN-2): reasoning that stays varied but stops depending on the input.

Entropy alone cannot see it: a policy can write many different thoughts that fit every state
equally well. What it loses is mutual information between the prompt X and the reasoning R.
We estimate it by cross-scoring a sample of N (prompt, reasoning) pairs: every reasoning r_i
under every prompt x_j with the current policy gives the matrix

    L[i, j] = log p(r_i | x_j)            (N, N), nats, summed over r_i's tokens

and from it

- ``collapse/retrieval_acc``: how often the true prompt scores r_i best (chance is 1/N);
- ``collapse/mi_estimate``: InfoNCE, mean_i [L[i, i] - log mean_j exp L[i, j]] in nats per
  reasoning; at most log N, 0 (or below) when the reasoning ignores the prompt;
- ``collapse/think_entropy``: entropy of the policy's next-token distribution at each reasoning
  token given the true prompt and the reasoning so far, averaged over a reasoning's tokens,
  then over reasonings (nats per token). High entropy with low MI is template collapse.

The pure math (:func:`collapse_stats`) is kept apart from the model scoring
(:func:`cross_loglik`), and the pairs are plain token ids (:func:`sample_pairs`).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache

from ragen import metric_names as names
from ragen.algos import logprobs_and_entropy
from ragen.models.kv_keyword import cache_kwarg
from ragen.rollout.trajectory import Trajectory

THINK_CLOSE = "</think>"
Pair = tuple[list[int], list[int]]
"""(prompt_ids, reasoning_ids): the context up to a reply, and the reply's think tokens."""


# ---------------------------------------------------------------------------- the pairs


def reasoning_length(
    reply_ids: Sequence[int], decode: Callable[[list[int]], str], close: str = THINK_CLOSE
) -> int:
    """How many leading reply tokens are reasoning: those before the token where ``close``
    begins; all of them when the reply never writes ``close``.

    Found through ``decode`` (e.g. ``tokenizer.decode``) rather than by matching the tag's
    ids, because a tokenizer merges the tag with its neighbours ('.</', '><').
    Takes O(log n) decodes of prefixes plus a few of the tag's tokens.
    """
    ids = list(reply_ids)
    if close not in decode(ids):
        return len(ids)
    lo, hi = 1, len(ids)  # the smallest k with close in decode(ids[:k]) lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if close in decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    start = lo - 1
    while close not in decode(ids[start:lo]):
        start -= 1  # the tag spans several tokens: walk back to the one where it begins
    return start


def sample_pairs(
    trajectories: Sequence[Trajectory],
    decode: Callable[[list[int]], str],
    *,
    max_pairs: int = 8,
    seed: int = 0,
    first_turn_only: bool = True,
) -> list[Pair]:
    """Up to ``max_pairs`` (prompt_ids, reasoning_ids) pairs with pairwise distinct prompts.

    Trajectories are visited in a seeded random order; from each, the first turn (or a
    random turn, ``first_turn_only=False``) gives the pair, its prompt the context the reply
    was sampled in. Copies of one group share their
    first prompt, so a prompt already taken is skipped: with two identical prompts the true
    one could not be told apart. Empty reasonings are skipped (nothing to score). First
    turns keep the prompts short, which is what the N x N scoring pays for.
    """
    rng = random.Random(seed)
    order = list(trajectories)
    rng.shuffle(order)
    pairs: list[Pair] = []
    seen: set[tuple[int, ...]] = set()
    for t in order:
        if len(pairs) >= max_pairs:
            break
        if not t.turns:
            continue
        turn = t.turns[0] if first_turn_only else rng.choice(t.turns)
        prompt = t.token_ids[turn.context_start : turn.reply_start]
        reply = t.token_ids[turn.reply_start : turn.reply_end]
        reasoning = reply[: reasoning_length(reply, decode)]
        if reasoning and tuple(prompt) not in seen:
            seen.add(tuple(prompt))
            pairs.append((list(prompt), list(reasoning)))
    return pairs


# ---------------------------------------------------------------------------- the math


def collapse_stats(loglik: torch.Tensor, entropy: torch.Tensor | None = None) -> dict[str, float]:
    """Retrieval accuracy and the InfoNCE mutual-information estimate from a score matrix.

    Args:
        loglik: (N, N), ``loglik[i, j] = log p(r_i | x_j)`` (reasoning i under prompt j), N >= 2.
        entropy: (N,) mean per-token entropy of reasoning i under its own prompt, or None.

    Returns ``collapse/retrieval_acc`` in [0, 1] (ties share the credit: a row whose best
    score is shared by k prompts, the true one among them, counts 1/k, the expectation of a
    random tie-break), ``collapse/mi_estimate`` (nats, <= log N), ``collapse/pairs`` (N) and,
    given ``entropy``, ``collapse/think_entropy``.
    """
    if loglik.dim() != 2 or loglik.shape[0] != loglik.shape[1] or loglik.shape[0] < 2:
        raise ValueError(f"loglik must be a square (N, N) matrix, N >= 2; got {loglik.shape}")
    n = loglik.shape[0]
    scores = loglik.double()
    own = scores.diagonal()  # (N,)
    best = scores.max(dim=1).values  # (N,)
    ties = (scores == best[:, None]).sum(dim=1)  # (N,)
    retrieved = torch.where(own == best, 1.0 / ties, 0.0)  # (N,)
    # log mean_j p(r_i | x_j) = logsumexp_j L[i, j] - log N: a stable mixture over prompts
    marginal = torch.logsumexp(scores, dim=1) - math.log(n)  # (N,)
    stats = {
        names.RETRIEVAL_ACC: float(retrieved.mean()),
        names.MI: float((own - marginal).mean()),
        "collapse/pairs": float(n),
    }
    if entropy is not None:
        stats["collapse/think_entropy"] = float(entropy.double().mean())
    return stats


# ---------------------------------------------------------------------------- the model


@torch.no_grad()
def cross_loglik(
    model,
    pairs: Sequence[Pair],
    *,
    micro_batch: int = 8,
    temperature: float = 1.0,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score every reasoning under every prompt with a causal LM.

    Each prompt is run once and its KV cache is shared by the reasonings scored under it
    (``micro_batch`` of them per forward pass), so the cost is N prompt passes plus N x N
    reasoning passes, not N x N full sequences. The log-softmax is chunked over positions
    (:func:`ragen.algos.logprobs_and_entropy`), so no (rows, V) float32 copy is made at once.

    Returns:
        loglik (N, N) float32, ``loglik[i, j] = sum_t log p(r_i[t] | x_j, r_i[:t])``;
        entropy (N,) float32, mean over r_i's tokens of the next-token entropy under x_i.
    """
    if not pairs:
        raise ValueError("cross_loglik needs at least one (prompt, reasoning) pair")
    if any(not prompt or not reasoning for prompt, reasoning in pairs):
        raise ValueError("every pair needs a non-empty prompt and a non-empty reasoning")
    n = len(pairs)
    loglik = torch.zeros(n, n)
    entropy = torch.zeros(n)
    device = next(model.parameters()).device
    for j, (prompt, _) in enumerate(pairs):
        prompt_cache = DynamicCache(config=model.config)
        out = model(
            input_ids=torch.tensor([prompt], device=device),
            **cache_kwarg(model, prompt_cache),
            use_cache=True,
            logits_to_keep=1,
        )
        first = out.logits[:, -1:]  # (1, 1, V): predicts every reasoning's first token
        for rows in torch.arange(n).split(micro_batch):
            reasonings = [pairs[i][1] for i in rows]
            scored = _score_reasonings(
                model, prompt_cache, first, reasonings, len(prompt), temperature, chunk
            )
            logp, ent, mask = (x.cpu() for x in scored)  # (B, L) each
            loglik[rows, j] = (logp * mask).sum(dim=1)
            for b, i in enumerate(rows.tolist()):
                if i == j:
                    entropy[i] = (ent[b] * mask[b]).sum() / mask[b].sum()
    return loglik, entropy


def _score_reasonings(
    model, prefix_cache, first_logits, reasonings, prompt_len, temperature, chunk
):
    """Log-probs and entropies of each reasoning token after one shared prompt.

    Returns (logp, entropy, mask), each (B, L), the reasonings right-padded to the longest L.
    """
    device = first_logits.device
    b, width = len(reasonings), max(len(r) for r in reasonings)
    labels = torch.zeros(b, width, dtype=torch.long, device=device)  # (B, L)
    mask = torch.zeros(b, width, device=device)  # (B, L)
    for row, r in enumerate(reasonings):
        labels[row, : len(r)] = torch.tensor(r, device=device)
        mask[row, : len(r)] = 1
    # The prompt's last position predicts every reasoning's first token.
    logp, ent = logprobs_and_entropy(
        first_logits.expand(b, 1, -1), labels[:, :1], chunk=chunk, temperature=temperature
    )  # (B, 1) each
    if width > 1:
        # The forward appends to the cache it is given: each batch gets its own copy.
        cache = copy.deepcopy(prefix_cache)
        cache.batch_repeat_interleave(b)
        attention = torch.cat([torch.ones(b, prompt_len, device=device), mask[:, :-1]], dim=1)
        # Right padding keeps every real token's position; the last token predicts nothing.
        out = model(
            input_ids=labels[:, :-1],
            attention_mask=attention.long(),
            **cache_kwarg(model, cache),
        )  # logits (B, L - 1, V)
        rest_logp, rest_ent = logprobs_and_entropy(
            out.logits, labels[:, 1:], chunk=chunk, temperature=temperature
        )  # (B, L - 1) each: scored apart, so no (B, L, V) copy is made
        logp, ent = torch.cat([logp, rest_logp], dim=1), torch.cat([ent, rest_ent], dim=1)
    return logp, ent, mask


def template_collapse_metrics(
    model,
    pairs: Sequence[Pair],
    *,
    micro_batch: int = 8,
    temperature: float = 1.0,
) -> dict[str, float]:
    """``collapse/…`` metrics of a sample of pairs (see the module docstring); empty when
    fewer than two pairs were found (one prompt cannot be told apart from nothing)."""
    if len(pairs) < 2:
        return {}
    loglik, entropy = cross_loglik(model, pairs, micro_batch=micro_batch, temperature=temperature)
    return collapse_stats(loglik, entropy)
