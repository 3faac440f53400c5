"""Per-token losses of the PPO update and how they are averaged.

Every loss returns a (B, T) per-token tensor that is 0 where ``mask == 0``, plus a dict of
detached statistics computed over the masked tokens only. Averaging into one number is a
separate step, :func:`aggregate`, so the aggregation mode is a choice of the trainer and not
of each loss. Statistics are 0-dim float32 tensors (``float(stat)`` for logging); they are 0
when the mask is empty.

``logprobs_and_entropy`` computes the log-probabilities of given labels (and the entropy)
from logits in chunks of rows, forward and backward, so the (B, T, V) logits are never
copied into a second full-size float tensor.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ragen.config import AGG_MODES

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "aggregate",
    "entropy_from_logits",
    "explained_variance",
    "kl_penalty",
    "logprobs_and_entropy",
    "masked_mean",
    "policy_loss",
    "token_logprobs",
    "truncated_is_weights",
    "value_loss",
]

KL_KINDS: tuple[str, ...] = ("k1", "k3")
RATIO_LEVELS: tuple[str, ...] = ("token", "sequence")

LOG_RATIO_LIMIT = 20.0
"""Log-ratios are clamped to +-20 before exp() so a stale token cannot overflow to inf."""


def _stat(x: Tensor) -> Tensor:
    return x.detach().to(torch.float32)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x (B, T) over the entries where mask != 0; 0 when there are none.
    Entries off the mask never enter, even when they are not finite."""
    on = mask != 0
    total = torch.where(on, x, 0.0).sum()
    return total / on.sum().clamp(min=1)


def _masked_max(x: Tensor, mask: Tensor) -> Tensor:
    on = mask != 0
    if not bool(on.any()):
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.where(on, x, torch.full((), -math.inf, dtype=x.dtype, device=x.device)).max()


# ----------------------------------------------------------------------------------- policy


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    ratio_level: str = "token",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with a decoupled ("clip-higher") range and optional dual clip.

    Args:
        logp: (B, T) log-probs of the sampled tokens under the current policy.
        old_logp: (B, T) log-probs under the policy that sampled them.
        advantages: (B, T).
        mask: (B, T) 1 on sampled tokens.
        clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high].
        dual_clip: c > 1; for negative advantages the loss is capped at ``-c * A``
            (Ye et al. 2020, dual-clip PPO). None disables it.
        ratio_level: ``token`` (PPO: each token its own ratio) or ``sequence`` (GSPO, Zheng
            et al. 2025): every token of a row takes the row's ratio ``s = exp(mean over its
            sampled tokens of (logp - old_logp))``, written ``sg[s] * exp(logp - sg[logp])``
            so its value is s and its gradient through token t is ``s * grad logp_t`` (the
            GSPO-token form): the clip then keeps or drops a whole row at once. Use it with
            ``loss_agg=seq_mean_token_mean`` for GSPO's objective.

    Returns:
        per_token_loss (B, T), 0 off the mask:
        ``max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``, then for A < 0
        ``min(that, -c * A)``; with ``ratio = exp(logp - old_logp)``.
        stats (over masked tokens):
        ``clipfrac_high`` share with A > 0 and ratio > 1 + clip_high (clip active, no gradient),
        ``clipfrac_low`` share with A < 0 and ratio < 1 - clip_low,
        ``clipfrac_dual`` share with A < 0 where the dual cap is active,
        ``approx_kl`` mean of ``(ratio - 1) - log(ratio)``, Schulman's k3 estimate of
        KL(pi_old || pi) from samples of pi_old (non-negative, unbiased),
        ``ratio_mean``, ``ratio_max``.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(
            f"ratio_level must be one of {', '.join(RATIO_LEVELS)}, got {ratio_level!r}"
        )
    on = mask != 0
    log_ratio = torch.where(on, logp - old_logp, 0.0)
    if ratio_level == "sequence":
        per_row = log_ratio.detach().sum(dim=1) / on.sum(dim=1).clamp(min=1)  # (B,)
        log_ratio = torch.where(on, per_row[:, None] + (logp - logp.detach()), 0.0)
    log_ratio = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = torch.where(on, advantages, 0.0)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(on)
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual = on & (adv < 0) & (loss > cap)
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)
    loss = torch.where(on, loss, 0.0)

    with torch.no_grad():
        high = on & (adv > 0) & (ratio > 1.0 + clip_high)
        low = on & (adv < 0) & (ratio < 1.0 - clip_low)
        stats = {
            "clipfrac_high": _stat(masked_mean(high.float(), mask)),
            "clipfrac_low": _stat(masked_mean(low.float(), mask)),
            "clipfrac_dual": _stat(masked_mean(dual.float(), mask)),
            "approx_kl": _stat(masked_mean((ratio - 1.0) - log_ratio, mask)),
            "ratio_mean": _stat(masked_mean(ratio, mask)),
            "ratio_max": _stat(_masked_max(ratio, mask)),
        }
    return loss, stats


def truncated_is_weights(
    train_logp: Tensor, rollout_logp: Tensor, mask: Tensor, cap: float | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance weights for the gap between the sampler and the trainer.

    The rollout engine (bf16 weights, a KV cache, vLLM) samples from a policy slightly off
    the one the update scores, so the PPO ratio, taken against the trainer's old log-probs,
    leaves that gap uncorrected. Truncated importance sampling (Yao et al. 2025) weights each
    token's loss by ``min(pi_train_old / pi_rollout, cap)``.

    Args:
        train_logp: (B, T) old log-probs as the trainer scores them.
        rollout_logp: (B, T) log-probs the rollout engine reported when it sampled.
        mask: (B, T) 1 on sampled tokens.
        cap: C; None gives weights 1 (the stats are still measured).

    Returns:
        weights (B, T), detached, 0 off the mask; stats over the masked tokens:
        ``rollout_mismatch`` mean ``|train_logp - rollout_logp|``, ``tis_capped`` share of
        tokens whose weight the cap cut.
    """
    on = mask != 0
    with torch.no_grad():
        log_ratio = torch.where(on, train_logp - rollout_logp, 0.0)
        ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
        capped = on & (ratio > cap) if cap is not None else torch.zeros_like(on)
        weights = ratio.clamp(max=cap) if cap is not None else torch.ones_like(ratio)
        stats = {
            "rollout_mismatch": _stat(masked_mean(log_ratio.abs(), mask)),
            "tis_capped": _stat(masked_mean(capped.float(), mask)),
        }
    return torch.where(on, weights, 0.0), stats


# ------------------------------------------------------------------------------------ value


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss.

    Args:
        values: (B, T) current critic values.
        old_values: (B, T) values when the rollout was scored.
        returns: (B, T) targets.
        mask: (B, T) 1 on sampled tokens.
        clip: the new value may move at most ``clip`` from the old one in the clipped term.

    Returns:
        per_token (B, T), 0 off the mask:
        ``0.5 * max((V - R)**2, (clip(V, old - clip, old + clip) - R)**2)``;
        stats: ``vf_clipfrac`` (share of masked tokens where the clip is active and the
        clipped term is the larger), ``values_mean`` and ``returns_mean`` over masked tokens.
    """
    on = mask != 0
    # Clamped to the band, not old + clamp(V - old): inside the band the clipped value is V
    # itself, bit for bit, so the two terms tie exactly instead of by float rounding.
    clipped_values = torch.clamp(values, old_values - clip, old_values + clip)
    unclipped = (values - returns).square()
    clipped = (clipped_values - returns).square()
    loss = torch.where(on, 0.5 * torch.maximum(unclipped, clipped), 0.0)
    with torch.no_grad():
        active = (values - old_values).abs() > clip
        stats = {
            "vf_clipfrac": _stat(masked_mean((active & (clipped > unclipped)).float(), mask)),
            "values_mean": _stat(masked_mean(values, mask)),
            "returns_mean": _stat(masked_mean(returns, mask)),
        }
    return loss, stats


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var[R - V] / Var[R]`` over the masked tokens (population variances).

    Args:
        values, returns, mask: (B, T).

    Returns:
        0-dim float32 tensor: 1 is a perfect critic, 0 no better than a constant, negative
        worse. 0 when the returns do not vary (undefined; 0 keeps logs finite).
    """
    with torch.no_grad():
        r = returns.double()
        diff = r - values.double()
        var_r = masked_mean((r - masked_mean(r, mask)).square(), mask)
        var_d = masked_mean((diff - masked_mean(diff, mask)).square(), mask)
        if float(var_r) <= 0.0:
            return torch.zeros((), dtype=torch.float32, device=values.device)
        return (1.0 - var_d / var_r).float()


# -------------------------------------------------------------------------------------- KL


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi.

    Args:
        logp: (B, T) log-probs under the policy.
        ref_logp: (B, T) log-probs under the reference model.
        kind: ``k1``: ``logp - ref_logp`` (unbiased, can be negative);
            ``k3``: ``exp(d) - d - 1`` with ``d = ref_logp - logp`` (unbiased, >= 0, lower
            variance; d is clamped to +-20 so exp stays finite). Schulman, "Approximating KL
            divergence" (2020).

    Returns:
        (B, T) per-token penalty; apply the mask when aggregating.
    """
    if kind == "k1":
        return logp - ref_logp
    if kind == "k3":
        d = (ref_logp - logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown KL kind {kind!r}; choose one of {list(KL_KINDS)}")


# ----------------------------------------------------------------------------- aggregation


def aggregate(
    per_token: Tensor, mask: Tensor, mode: str, normalizer: float | Tensor | None = None
) -> Tensor:
    """Average a per-token loss into a scalar.

    Args:
        per_token: (B, T).
        mask: (B, T) 1 on tokens that count.
        mode: ``token_mean``: sum over masked tokens / number of masked tokens.
            ``seq_mean_token_mean``: mean over each row's masked tokens, then mean over the
            rows that have any. ``seq_mean_token_sum``: sum over each row's masked tokens,
            then mean over the rows that have any.
        normalizer: replaces the final divisor (token count, or row count for the seq_*
            modes). For gradient accumulation pass the mini-batch's total, so the micro-batch
            results add up to the mini-batch aggregate.

    Returns:
        0-dim tensor; 0 when no token is masked (never NaN).
    """
    on = mask != 0
    weights = mask.to(per_token.dtype)
    masked = torch.where(on, per_token * weights, 0.0)
    if mode == "token_mean":
        total, count = masked.sum(), weights.sum()
    elif mode in ("seq_mean_token_mean", "seq_mean_token_sum"):
        rows = masked.sum(dim=1)  # (B,)
        if mode == "seq_mean_token_mean":
            rows = rows / weights.sum(dim=1).clamp(min=1e-12)
        total, count = rows.sum(), on.any(dim=1).sum().to(per_token.dtype)
    else:
        raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {list(AGG_MODES)}")
    if normalizer is not None:
        count = torch.as_tensor(normalizer, dtype=per_token.dtype, device=per_token.device)
    return total / count.clamp(min=1e-12)  # no token: 0 / tiny = 0


# -------------------------------------------------------------------- log-probs and entropy


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) along the last dim, computed in float32.

    Args:
        logits: (..., V), finite.

    Returns:
        (...) ``H = logsumexp(z) - sum softmax(z) * z`` (no log of a probability, so no
        0 * -inf).
    """
    z = logits.float()
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


class _ChunkedLogprobs(torch.autograd.Function):
    """Log-probs of labels and entropies from (N, V) logits, chunk by chunk.

    Forward keeps only the logits (the caller's tensor), the labels and two (N,) results;
    backward recomputes softmax per chunk and writes the gradient chunk by chunk, so besides
    the logits' own gradient no full-size tensor is made.
    """

    @staticmethod
    def forward(ctx, logits, labels, chunk, temperature, with_entropy):
        n = logits.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        ent = torch.zeros(n, dtype=torch.float32, device=logits.device)
        for s in range(0, n, chunk):
            z = logits[s : s + chunk].float() / temperature  # (c, V)
            lse = torch.logsumexp(z, dim=-1)
            logp[s : s + chunk] = z.gather(1, labels[s : s + chunk, None]).squeeze(1) - lse
            if with_entropy:
                ent[s : s + chunk] = lse - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
        ctx.save_for_backward(logits, labels, ent)
        ctx.chunk, ctx.temperature, ctx.with_entropy = chunk, temperature, with_entropy
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp, grad_ent):
        logits, labels, ent = ctx.saved_tensors
        grad = torch.empty_like(logits)
        chunk, temperature = ctx.chunk, ctx.temperature
        for s in range(0, logits.shape[0], chunk):
            z = logits[s : s + chunk].float() / temperature  # (c, V)
            logq = torch.log_softmax(z, dim=-1)
            p = logq.exp()
            g = torch.zeros_like(z)
            if grad_logp is not None:  # d logp / dz = onehot(label) - p
                g -= p * grad_logp[s : s + chunk, None]
                g.scatter_add_(1, labels[s : s + chunk, None], grad_logp[s : s + chunk, None])
            if ctx.with_entropy and grad_ent is not None:
                # dH / dz_j = -p_j * (log p_j + H)
                h = ent[s : s + chunk, None]
                g -= grad_ent[s : s + chunk, None] * p * (logq + h)
            grad[s : s + chunk] = (g / temperature).to(grad.dtype)
        return grad, None, None, None, None


def logprobs_and_entropy(
    logits: Tensor,
    labels: Tensor,
    *,
    chunk: int = 1024,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor]:
    """Per-token log-probs of ``labels`` and entropies, chunked over rows, differentiable.

    Args:
        logits: (B, T, V) (any float dtype; computed in float32).
        labels: (B, T) long token ids in [0, V) (use any valid id on positions to ignore).
        chunk: rows (B*T positions) per chunk; one chunk makes a few (chunk, V) float32
            temporaries (1024 x 49152 x 4 bytes = 200 MB).
        temperature: logits are divided by it (match the sampling temperature).
        with_entropy: also compute the entropy (else it is returned as zeros).

    Returns:
        logp (B, T) float32 ``log softmax(z / temperature)[label]`` and entropy (B, T) float32.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits (B, T, V) and labels (B, T) disagree: {tuple(logits.shape)} vs "
            f"{tuple(labels.shape)}"
        )
    lead, vocab = labels.shape, logits.shape[-1]
    logp, ent = _ChunkedLogprobs.apply(
        logits.reshape(-1, vocab), labels.reshape(-1), chunk, temperature, with_entropy
    )
    return logp.view(lead), ent.view(lead)


def token_logprobs(
    logits: Tensor, labels: Tensor, *, chunk: int = 1024, temperature: float = 1.0
) -> Tensor:
    """(B, T) float32 log-probs of ``labels`` under ``logits`` (B, T, V); see
    :func:`logprobs_and_entropy`."""
    return logprobs_and_entropy(
        logits, labels, chunk=chunk, temperature=temperature, with_entropy=False
    )[0]
