"""The PPO update: epochs over shuffled mini-batches, gradients accumulated over micro-batches.

Per micro-batch: the policy loss (decoupled clip), minus the entropy bonus, plus the KL
penalty when it is on; the critic's clipped value loss. Each is aggregated with the
mini-batch's normaliser, so micro-batch losses add up to the mini-batch loss exactly. A
mini-batch whose loss or gradient norm is not finite is skipped: no optimiser step, the
weights stay as they were, and ``actor/skipped_steps`` counts it.

Data parallel (see distributed.py): every rank holds the whole batch and draws the same
mini-batches; each back-propagates its share of a mini-batch's rows with the whole
mini-batch's normaliser, the gradients are summed across ranks, and every rank takes the
same step, the one a single process would take. With sharded models (FSDP2, see fsdp.py) the
ranks run their micro-batches in lockstep, and FSDP2 sums the gradients during the backward.
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ragen import metric_names as names
from ragen.algos import aggregate, explained_variance, kl_penalty, policy_loss, value_loss
from ragen.config import AlgoConfig, TrainerConfig
from ragen.train import distributed
from ragen.train.scoring import critic_values, policy_logprobs


@dataclass(frozen=True)
class UpdateSettings:
    """What the update reads besides the batch: the config's ``algo`` section (clipping, loss
    coefficients, aggregation) and ``trainer`` section (epochs, batch sizes, gradient clip),
    as they are, plus what the trainer derives for this step."""

    algo: AlgoConfig
    trainer: TrainerConfig
    temperature: float
    """The rollout's sampling temperature: log-probs are scored at it."""
    autocast_dtype: torch.dtype | None
    sharded: bool = False
    """The models are sharded with FSDP2 (trainer.parallel=fsdp under torchrun)."""


@dataclass
class UpdateData:
    """Everything the update reads, each (B, T) unless noted; rows are episodes."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    old_values: torch.Tensor | None

    def rows(self, index: torch.Tensor) -> UpdateData:
        """A sub-batch, trimmed to its longest row (right padding only)."""
        width = int(self.attention_mask[index].sum(dim=1).max())

        def take(x: torch.Tensor) -> torch.Tensor:
            return x[index, :width]

        def take_optional(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else take(x)

        return UpdateData(
            input_ids=take(self.input_ids),
            attention_mask=take(self.attention_mask),
            loss_mask=take(self.loss_mask),
            advantages=take(self.advantages),
            returns=take(self.returns),
            old_logprobs=take(self.old_logprobs),
            ref_logprobs=take_optional(self.ref_logprobs),
            old_values=take_optional(self.old_values),
        )


def _normaliser(mask: torch.Tensor, mode: str) -> float:
    """The mini-batch's divisor for ``aggregate``: its token count, or its row count."""
    if mode == "token_mean":
        return float(mask.sum())
    return float((mask.sum(dim=1) > 0).sum())


class _Tally:
    """Weighted means of statistics (micro-batch ones weighted by sampled tokens)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, stats: dict[str, float], weight: float) -> None:
        for key, value in stats.items():
            self.sums[key] += float(value) * weight
            self.weights[key] += weight

    def global_means(self) -> dict[str, float]:
        """The means over every rank's additions."""
        sums, weights = distributed.sum_dicts(self.sums), distributed.sum_dicts(self.weights)
        return {k: sums[k] / weights[k] for k in sums if weights[k] > 0}


# Losses aggregated with the mini-batch's normaliser: a micro-batch holds its share of the
# mini-batch value, so these add up over micro-batches (the rest are micro-batch means).
_ADDITIVE = ("actor/pg_loss", names.ENTROPY, "actor/kl", "critic/value_loss")


def _micro_loss(policy, critic, data: UpdateData, s: UpdateSettings, norm: float):
    """(actor loss, critic loss or None, stats) of one micro-batch; the ``_ADDITIVE`` stats
    are its shares of the mini-batch values."""
    mask = data.loss_mask
    logp, entropy = policy_logprobs(
        policy, data.input_ids, data.attention_mask, mask, temperature=s.temperature
    )
    pg_tok, stats = policy_loss(
        logp,
        data.old_logprobs,
        data.advantages,
        mask,
        s.algo.clip_low,
        s.algo.clip_high,
        s.algo.dual_clip,
    )
    pg = aggregate(pg_tok, mask, s.algo.loss_agg, norm)
    ent = aggregate(entropy, mask, s.algo.loss_agg, norm)
    actor = pg - s.algo.entropy_coef * ent
    out = {f"actor/{k}": float(v) for k, v in stats.items()}
    out.update({"actor/pg_loss": float(pg.detach()), names.ENTROPY: float(ent.detach())})
    if data.ref_logprobs is not None and s.algo.kl_coef > 0:
        kl = aggregate(
            kl_penalty(logp, data.ref_logprobs, s.algo.kl_type), mask, s.algo.loss_agg, norm
        )
        actor = actor + s.algo.kl_coef * kl
        out["actor/kl"] = float(kl.detach())
    critic_loss = None
    if critic is not None:
        values = critic_values(critic, data.input_ids, data.attention_mask)
        assert data.old_values is not None  # the trainer scores old values when it has a critic
        v_tok, v_stats = value_loss(values, data.old_values, data.returns, mask, s.algo.value_clip)
        critic_loss = aggregate(v_tok, mask, s.algo.loss_agg, norm)
        out.update({f"critic/{k}": float(v) for k, v in v_stats.items()})
        out["critic/value_loss"] = float(critic_loss.detach())
        out["critic/explained_var"] = float(explained_variance(values.detach(), data.returns, mask))
    return actor, critic_loss, out


def _micro_batches(rows: int, s: UpdateSettings) -> list[tuple[torch.Tensor, bool]]:
    """This rank's micro-batches of a mini-batch of ``rows`` rows: (row indices, counts).

    With sharded models every pass is a collective (each layer's weights are gathered, its
    gradient reduced), so every rank runs as many passes as the rank with the most rows
    (``ceil(rows / W)``); the others add passes over row 0 that do not count (weight 0).
    """
    mine = distributed.shard(rows)
    chunks = torch.arange(mine.start, mine.stop).split(s.trainer.micro_batch_size)
    micros = [(m, True) for m in chunks if len(m)]  # a rank may hold no row: split gives ([],)
    if s.sharded:
        most = -(-rows // distributed.world_size())
        passes = -(-most // s.trainer.micro_batch_size)
        micros += [(torch.tensor([0]), False)] * (passes - len(micros))
    return micros


def _backward_share(
    policy, critic, mini_data: UpdateData, s: UpdateSettings, norm: float, autocast, tally: _Tally
) -> dict[str, float] | None:
    """Back-propagate this rank's share of a mini-batch (all of it in one process), micro-batch
    by micro-batch, forwards under ``autocast``, adding the micro-batch stats to ``tally``.
    Returns the share's part of the ``_ADDITIVE`` stats, or None when a loss was not finite."""
    sums: dict[str, float] = defaultdict(float)
    finite = True
    for micro, counts in _micro_batches(len(mini_data.input_ids), s):
        part = mini_data.rows(micro)
        with autocast:
            actor, critic_loss, stats = _micro_loss(policy, critic, part, s, norm)
        total = actor if critic_loss is None else actor + critic_loss
        if not counts:
            (total * 0.0).backward()  # only for the collectives: adds zero to every gradient
            continue
        finite = finite and bool(torch.isfinite(total))
        # Back-propagated even when not finite (the step is skipped anyway): with sharded
        # models the other ranks wait for this pass's gradient reduction.
        total.backward()
        if finite:
            for key in _ADDITIVE:
                if key in stats:
                    sums[key] += stats.pop(key)
            tally.add(stats, float(part.loss_mask.sum()))
    return sums if finite else None


def ppo_update(
    policy,
    critic,
    optimizers: dict[str, torch.optim.Optimizer],
    data: UpdateData,
    s: UpdateSettings,
    *,
    seed: int,
) -> dict[str, float]:
    """Run the PPO epochs; returns the step's ``actor/…`` and ``critic/…`` metrics (the same
    on every rank).

    Each epoch splits the shuffled episodes into mini-batches of ``mini_batch_size``, the
    last one holding the rest; a batch smaller than ``mini_batch_size`` (a filter that keeps
    a varying number of groups kept few) is one mini-batch, so one optimiser step."""
    generator = torch.Generator().manual_seed(seed)
    tally, skipped, steps = _Tally(), 0, 0
    totals: dict[str, float] = defaultdict(float)  # this rank's shares of _ADDITIVE stats
    autocast = (
        torch.autocast(data.input_ids.device.type, dtype=s.autocast_dtype)
        if s.autocast_dtype is not None
        else nullcontext()
    )
    policy.train()
    for _ in range(s.trainer.ppo_epochs):
        order = torch.randperm(len(data.input_ids), generator=generator)
        for mini in order.split(s.trainer.mini_batch_size):
            mini_data = data.rows(mini)
            norm = _normaliser(mini_data.loss_mask, s.algo.loss_agg)
            if norm == 0:
                continue  # nothing sampled in this mini-batch: no gradient to take
            for opt in optimizers.values():
                opt.zero_grad(set_to_none=True)
            sums = _backward_share(policy, critic, mini_data, s, norm, autocast, tally)
            finite = distributed.all_true(sums is not None)  # one rank's NaN skips it for all
            if not s.sharded:  # FSDP2 summed them during the backward
                distributed.sum_gradients(_trainable(policy, critic))
            norms = _clip(
                policy, critic, s.trainer.grad_clip
            )  # of the summed, whole-batch gradient
            finite = finite and all(math.isfinite(n) for n in norms.values())
            if finite:
                assert sums is not None  # all_true above is False on a rank without sums
                for opt in optimizers.values():
                    opt.step()
                steps += 1
                tally.add(norms, 1.0)
                for key, value in sums.items():
                    totals[key] += value
            else:
                skipped += 1
            for opt in optimizers.values():
                opt.zero_grad(set_to_none=True)
    policy.eval()
    metrics = tally.global_means()
    if steps:  # a mini-batch's value is the sum of the ranks' shares; averaged over the steps
        metrics.update({k: v / steps for k, v in distributed.sum_dicts(totals).items()})
    metrics.update({"actor/skipped_steps": float(skipped), "actor/optimizer_steps": float(steps)})
    return metrics


def _trainable(policy, critic) -> list[torch.nn.Parameter]:
    models = [policy] if critic is None else [policy, critic]
    return [p for model in models for p in model.parameters() if p.requires_grad]


def _clip(policy, critic, max_norm: float) -> dict[str, float]:
    """Clip each model's gradients to ``max_norm``; returns the norms before clipping."""
    norms = {names.GRAD_NORM: _clip_one(policy, max_norm)}
    if critic is not None:
        norms["critic/grad_norm"] = _clip_one(critic, max_norm)
    return norms


def _clip_one(model, max_norm: float) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
