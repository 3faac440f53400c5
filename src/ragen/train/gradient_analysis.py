"""RAGEN-2's gradient reporter: the gradient norm of each loss term, per reward-variance bucket.

On the steps ``trainer.gradient_analysis_every`` picks, before the update, the step's kept
groups are cut into reward-variance buckets (`ragen.algos.buckets`), and on each bucket's
rows alone, and on all of them (``all``), the gradient of each term of the loss
(`update.micro_terms`: task, entropy, kl, value, where the loss has it) is measured. A bucket
is a batch of its own: its terms are aggregated with its own normaliser (by default the mean
over its sampled tokens), so a small bucket's norm is on the scale of a large one's. Each
term's gradient is accumulated the way the update accumulates the loss's (micro-batches of
``trainer.micro_batch_size``, the rows' shared opening once per bucket, each rank's share
summed over ranks), its norm taken over the model the term trains (the policy for task,
entropy and kl, the critic for value), and then dropped; only that model's passes run.

Nothing of the step changes: no optimiser runs, the gradients are cleared, and the global
random state is restored, so the update that follows is the one a step without the analysis
takes. It costs, per term, a forward and a backward of the batch through the model the term
trains, twice (the buckets, then ``all``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

from ragen import metric_names as names
from ragen.algos.buckets import ALL, bucket_name, row_buckets
from ragen.train import distributed
from ragen.train.scoring import critic_values, reads_policy_pass
from ragen.train.update import (
    Openings,
    UpdateData,
    UpdateSettings,
    by_length,
    critic_loss,
    micro_batches,
    micro_terms,
    normaliser,
)


def due(every: int, step: int) -> bool:
    """Whether ``step`` (from 0) is analysed: every ``every`` steps from the first; never
    when ``every`` is 0."""
    return every > 0 and step % every == 0


def loss_terms(s: UpdateSettings, data: UpdateData, critic) -> list[str]:
    """The terms of the step's loss, in `names.GRAD_NORM_TERMS` order: task; entropy when
    its coefficient is not 0; kl when the penalty is on; value with a critic."""
    has = {
        "task": True,
        "entropy": s.algo.entropy_coef > 0,
        "kl": data.ref_logprobs is not None and s.algo.kl_coef > 0,
        "value": critic is not None,
    }
    return [term for term in names.GRAD_NORM_TERMS if has[term]]


@contextmanager
def untouched_random_state(device: torch.device) -> Iterator[None]:
    """Within it, draws from torch's global generators (dropout, were a model to have it) are
    undone on leaving, so the rest of the step draws what it would have."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        yield


def bucket_norms(
    policy,
    critic,
    data: UpdateData,
    returns: torch.Tensor,
    group_ids: torch.Tensor,
    s: UpdateSettings,
    buckets: int,
) -> dict[str, float]:
    """The reporter's metrics (`names.bucket_metric`) of the batch ``data``.

    data: the step's kept rows, (R, T) each, advantages filled in: one per episode, or one
        per turn sample (``data.episodes`` (R,) then names each row's episode).
    returns, group_ids: (E,) each kept episode's return and group.
    buckets: how many reward-variance buckets (`ragen.algos.buckets.variance_buckets`).

    Per non-empty bucket and ``all``: each term's gradient norm, and the bucket's rows,
    sampled tokens and range of its groups' reward std. The weights and the optimisers' state
    are left as they were, the gradients cleared (None)."""
    assert data.advantages is not None  # the trainer estimates them before it calls this
    episodes = None if data.episodes is None else data.episodes.cpu()
    bucket_of, stds = row_buckets(returns.cpu(), group_ids.cpu(), buckets, episodes)  # (R,), (R,)
    chosen = [(ALL, torch.arange(len(bucket_of)))]
    for k in range(buckets):
        rows = (bucket_of == k).nonzero().flatten()
        if len(rows):
            chosen.append((bucket_name(k), rows))
    terms = loss_terms(s, data, critic)
    autocast = (
        torch.autocast(data.input_ids.device.type, dtype=s.autocast_dtype)
        if s.autocast_dtype is not None
        else nullcontext()
    )
    metrics: dict[str, float] = {}
    policy.train()
    try:
        for bucket, rows in chosen:
            part = data.rows(by_length(rows, data.attention_mask))  # micro-batches pad less
            metrics.update(_facts(bucket, part, stds[rows]))
            norm = normaliser(part.loss_mask, s.algo.aggregation())
            if norm == 0:
                continue  # no sampled token in the bucket: no gradient to measure
            for term in terms:
                value = _term_norm(policy, critic, part, s, norm, term, autocast)
                metrics[names.bucket_metric(bucket, term)] = value
    finally:
        _clear(policy, critic)
        policy.eval()
    return metrics


def _facts(bucket: str, part: UpdateData, stds: torch.Tensor) -> dict[str, float]:
    """What the reporter logs of a bucket besides its norms (`names.BUCKET_FACTS`)."""
    facts = {
        "rows": float(len(part.input_ids)),
        "tokens": float(part.loss_mask.sum()),
        "reward_std_min": float(stds.min()),
        "reward_std_max": float(stds.max()),
    }
    return {names.bucket_metric(bucket, key): facts[key] for key in names.BUCKET_FACTS}


def _term_norm(
    policy, critic, data: UpdateData, s: UpdateSettings, norm: float, term: str, autocast
) -> float:
    """The norm of the gradient of loss term ``term`` of the rows ``data`` (aggregated with
    ``norm``), summed over ranks, over the parameters of the model the term trains. Only that
    model's passes run: the critic's alone for ``value`` (unless it reads the policy's pass),
    the policy's alone for the others."""
    _clear(policy, critic)
    own_critic = term == "value" and not reads_policy_pass(policy, critic)
    run_policy = None if own_critic else policy
    run_critic = critic if term == "value" else None
    micros = micro_batches(data, s)
    mine = any(counts for _, counts in micros)
    openings = Openings.of(run_policy, run_critic, data, mine, s, autocast)
    for micro, counts in micros:
        part = data.rows(micro)
        with autocast:
            if own_critic:
                values = critic_values(critic, part.input_ids, part.attention_mask, openings.critic)
                assert part.old_values is not None  # scored, or estimated, with a critic
                loss = critic_loss(values, part.old_values, part, s, norm)[0]
            else:
                loss = micro_terms(run_policy, run_critic, part, s, norm, openings)[0][term]
        # a pass that does not count (sharded models) only runs the collectives
        (loss if counts else loss * 0.0).backward()
    openings.backward()
    if not s.sharded:  # FSDP2 summed them during the backward
        distributed.sum_gradients(_parameters(policy, critic))
    model = critic if term == "value" else policy
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def _parameters(*models) -> list[torch.nn.Parameter]:
    return [p for m in models if m is not None for p in m.parameters() if p.requires_grad]


def _clear(*models) -> None:
    """Drop the gradients of ``models`` (None: as the optimisers' zero_grad leaves them)."""
    for p in _parameters(*models):
        p.grad = None
