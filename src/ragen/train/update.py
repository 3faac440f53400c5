"""The PPO update: epochs over shuffled mini-batches, gradients accumulated over micro-batches.

Per micro-batch: the policy loss (decoupled clip), weighted per token by truncated importance
sampling when the trainer passes the sampler's log-probs, minus the entropy bonus, plus the
KL penalty when it is on; the critic's clipped value loss. Each is aggregated with the
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
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import torch

from ragen import metric_names as names
from ragen import phases
from ragen.algos import (
    Coefficients,
    aggregate,
    estimate,
    explained_variance,
    kl_penalty,
    policy_loss,
    value_loss,
    whiten,
)
from ragen.algos.losses import truncated_is_weights
from ragen.config import AlgoConfig, TrainerConfig
from ragen.train import distributed
from ragen.train.forward import SharedOpening, critic_opening
from ragen.train.scoring import critic_values, policy_logprobs_and_values, reads_policy_pass
from ragen.train.update_memory import MemoryPlan, PassPlan


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
    plan_memory: bool = False
    """Cut micro-batches to the host memory free at the update's start (update_memory.py):
    models in host memory, not sharded."""


@dataclass
class UpdateData:
    """Everything the update reads, each (B, T) unless noted; rows are episodes, or their turn
    samples when the context window is not full (``episodes`` then says whose).

    On-policy shortcuts (``Trainer.on_policy``): ``old_logprobs`` None means the
    update's own forward gives them (same weights, same rows). ``advantages`` None means the
    update estimates them: it trains the critic first and feeds its values, with
    ``rewards``, to ``algo.estimator`` (one of ``ROW_BY_ROW``); ``returns`` and
    ``old_values`` are None then too.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor | None
    returns: torch.Tensor | None
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    old_values: torch.Tensor | None
    rewards: torch.Tensor | None = None
    rollout_logprobs: torch.Tensor | None = None  # what the sampler reported (TIS)
    episodes: torch.Tensor | None = None  # (B,) long: each turn sample's episode

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
            advantages=take_optional(self.advantages),
            returns=take_optional(self.returns),
            old_logprobs=take_optional(self.old_logprobs),
            ref_logprobs=take_optional(self.ref_logprobs),
            old_values=take_optional(self.old_values),
            rewards=take_optional(self.rewards),
            rollout_logprobs=take_optional(self.rollout_logprobs),
            episodes=None if self.episodes is None else self.episodes[index],
        )


def mini_batch_rows(
    attention_mask: torch.Tensor,
    epochs: int,
    size: int,
    seed: int,
    episodes: torch.Tensor | None = None,
) -> Iterator[torch.Tensor]:
    """The row indices of each mini-batch, in the order the update runs them: per epoch a
    permutation drawn from ``seed``, cut into mini-batches of ``size`` rows (the last holds
    the rest), each ordered ``by_length``, so that the micro-batches cut from it hold rows of
    like length and pad less. The gradient is the mini-batch's whatever its rows' order (up
    to float summation order).

    attention_mask: (B, T) of the batch, right-padded.
    episodes: (B,) the episode of each row when rows are turn samples: the permutation and
    the ``size`` are then of episodes, and a mini-batch holds all the rows of its episodes,
    so a window other than full takes as many optimiser steps as the full one."""
    generator = torch.Generator().manual_seed(seed)
    units = None if episodes is None else torch.unique(episodes.cpu())
    for _ in range(epochs):
        if units is None:
            order = torch.randperm(len(attention_mask), generator=generator)
        else:
            order = units[torch.randperm(len(units), generator=generator)]
        for mini in order.split(size):
            if episodes is not None:
                mini = torch.isin(episodes.cpu(), mini).nonzero().squeeze(1)
            yield by_length(mini, attention_mask)


def by_length(rows: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``rows`` (indices into the (B, T) batch) longest first, ties in their given order: the
    micro-batches cut from them in turn hold rows of like length, and pad less."""
    # rows live on the CPU (drawn there, the same on any device); the mask may be on a GPU
    lengths = attention_mask[rows.to(attention_mask.device)].sum(dim=1).cpu()
    return rows[torch.argsort(lengths, descending=True, stable=True)]


def normaliser(mask: torch.Tensor, mode: str) -> float:
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


@dataclass(frozen=True)
class _MiniPass:
    """What every backward pass over one mini-batch shares: the update's settings, the
    mini-batch's loss normaliser, the forwards' autocast context, the tally the micro-batch
    stats go to, and the memory plan that cuts micro-batches (None: the configured rows)."""

    s: UpdateSettings
    norm: float
    autocast: AbstractContextManager
    tally: _Tally
    plan: MemoryPlan | None

    def for_pass(self, *, policy: bool, critic: bool) -> PassPlan | None:
        """The plan of a pass through these models (None without a plan)."""
        return None if self.plan is None else self.plan.for_pass(policy=policy, critic=critic)


@dataclass
class Openings:
    """The mini-batch's shared openings of the policy's and the critic's decoders (None: each
    micro-batch runs its own shared prefix)."""

    policy: SharedOpening | None = None
    critic: SharedOpening | None = None

    @classmethod
    def of(
        cls, policy, critic, mini_data: UpdateData, mine: bool, s: UpdateSettings, autocast
    ) -> Openings:
        """Run the openings of the mini-batch once for all its micro-batches (``SharedOpening``),
        if this rank holds some of its rows (``mine``). Of all its rows, not the rank's: every
        row is then computed the same way however the rows are shared among processes. Not
        for sharded models: each of their forwards is a collective that every rank runs in
        step, and a rank's opening would be one pass more than the others expect."""
        if s.sharded or not mine:
            return cls()
        ids, mask = mini_data.input_ids, mini_data.attention_mask
        # a head on the policy's trunk reads the policy's pass, opening included
        own_critic = critic is not None and not reads_policy_pass(policy, critic)
        with phases.timed(phases.UPDATE_FORWARD), autocast:
            return cls(
                policy=None if policy is None else SharedOpening(policy.get_decoder(), ids, mask),
                critic=critic_opening(critic, ids, mask) if own_critic else None,
            )

    def backward(self) -> None:
        """The openings' backward, once, from what the micro-batches left on them."""
        with phases.timed(phases.UPDATE_BACKWARD):
            for opening in (self.policy, self.critic):
                if opening is not None:
                    opening.backward()


def micro_terms(
    policy, critic, data: UpdateData, s: UpdateSettings, norm: float, openings: Openings
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(the terms of the loss, stats) of one micro-batch: ``task`` the policy loss,
    ``entropy`` minus entropy_coef times the entropy bonus, ``kl`` kl_coef times the KL penalty
    (when it is on), ``value`` the critic's loss (with a critic), each a scalar aggregated
    with ``norm``; `total` adds them up. The ``_ADDITIVE`` stats are its shares of the
    mini-batch values."""
    mask = data.loss_mask
    assert data.advantages is not None  # estimated before the policy's micro-batches run
    logp, entropy, values = policy_logprobs_and_values(
        policy,
        critic if reads_policy_pass(policy, critic) else None,
        data.input_ids,
        data.attention_mask,
        mask,
        temperature=s.temperature,
        opening=openings.policy,
    )
    old_logprobs = logp.detach() if data.old_logprobs is None else data.old_logprobs
    pg_tok, stats = policy_loss(
        logp,
        old_logprobs,
        data.advantages,
        mask,
        s.algo.clip_low,
        s.algo.clip_high,
        s.algo.dual_clip,
        s.algo.ratio_level,
    )
    if data.rollout_logprobs is not None:
        weights, gap = truncated_is_weights(
            old_logprobs, data.rollout_logprobs, mask, s.algo.tis_cap
        )
        pg_tok = pg_tok * weights
        stats.update(gap)
    pg = aggregate(pg_tok, mask, s.algo.aggregation(), norm)
    ent = aggregate(entropy, mask, s.algo.aggregation(), norm)
    terms = {"task": pg, "entropy": -(s.algo.entropy_coef * ent)}
    out = {f"actor/{k}": float(v) for k, v in stats.items()}
    out.update({"actor/pg_loss": float(pg.detach()), names.ENTROPY: float(ent.detach())})
    if data.ref_logprobs is not None and s.algo.kl_coef > 0:
        kl = aggregate(
            kl_penalty(logp, data.ref_logprobs, s.algo.kl_type), mask, s.algo.aggregation(), norm
        )
        terms["kl"] = s.algo.kl_coef * kl
        out["actor/kl"] = float(kl.detach())
    if critic is not None:
        if values is None:
            values = critic_values(critic, data.input_ids, data.attention_mask, openings.critic)
        assert data.old_values is not None  # the trainer scores old values when it has a critic
        terms["value"], critic_stats = critic_loss(values, data.old_values, data, s, norm)
        out.update(critic_stats)
    return terms, out


def total(terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss of a micro-batch: its terms (`micro_terms`) added up, the policy's first."""
    loss = terms["task"]
    for name in ("entropy", "kl", "value"):
        if name in terms:
            loss = loss + terms[name]
    return loss


def critic_loss(values, old_values, data: UpdateData, s: UpdateSettings, norm: float):
    """(clipped value loss, its ``critic/…`` stats) of a micro-batch's values (B, T)."""
    mask = data.loss_mask
    assert data.returns is not None
    v_tok, v_stats = value_loss(values, old_values, data.returns, mask, s.algo.value_clip)
    loss = aggregate(v_tok, mask, s.algo.aggregation(), norm)
    out = {f"critic/{k}": float(v) for k, v in v_stats.items()}
    out["critic/value_loss"] = float(loss.detach())
    out["critic/explained_var"] = float(explained_variance(values.detach(), data.returns, mask))
    return loss, out


def _critic_first(
    critic, mini_data: UpdateData, p: _MiniPass
) -> tuple[UpdateData, dict[str, float] | None]:
    """On-policy with a row-by-row estimator: back-propagate the critic's loss micro-batch by
    micro-batch, each row's returns estimated from the values of the very forward that is
    trained (the values a scoring pass would give, so the value clip is inactive, as it is
    at a first epoch); then estimate the whole mini-batch's advantages from those values
    (whitened over it when the algo whitens).

    Returns the mini-batch with advantages, returns and old values filled in, and the critic's
    share of the ``_ADDITIVE`` stats (None when a loss was not finite)."""
    assert mini_data.rewards is not None  # the trainer passes rewards when it leaves this here
    s = p.s
    values = torch.zeros(mini_data.loss_mask.shape, device=mini_data.loss_mask.device)
    sums: dict[str, float] = defaultdict(float)
    finite = True
    coefs = Coefficients.of(s.algo)
    mine = distributed.shard(len(mini_data.input_ids))
    opening = Openings.of(None, critic, mini_data, len(mine) > 0, s, p.autocast)
    rows = torch.arange(mine.start, mine.stop)
    plan = p.for_pass(policy=False, critic=True)
    for micro in _split(rows, mini_data, s, plan, opening.critic):
        part = mini_data.rows(micro)
        assert part.rewards is not None
        with phases.timed(phases.UPDATE_FORWARD), p.autocast:
            v = critic_values(critic, part.input_ids, part.attention_mask, opening.critic)
        with phases.timed(phases.ADVANTAGES):
            _, returns = estimate(
                s.algo.estimator,
                rewards=part.rewards,
                mask=part.loss_mask,
                values=v.detach(),
                coefs=coefs,
            )
        loss, stats = critic_loss(v, v.detach(), replace(part, returns=returns), s, p.norm)
        finite = finite and bool(torch.isfinite(loss))
        with phases.timed(phases.UPDATE_BACKWARD):
            loss.backward()
        values[micro, : v.shape[1]] = v.detach().float()
        if finite:
            sums["critic/value_loss"] += stats.pop("critic/value_loss")
            p.tally.add(stats, float(part.loss_mask.sum()))
    opening.backward()
    values = distributed.assemble_rows(values[mine.start : mine.stop], mine, len(values))
    with phases.timed(phases.ADVANTAGES):
        advantages, returns = estimate(
            s.algo.estimator,
            rewards=mini_data.rewards,
            mask=mini_data.loss_mask,
            values=values,
            coefs=coefs,
        )
        if s.algo.whitens():
            advantages = whiten(advantages, mini_data.loss_mask)
    estimated = replace(
        mini_data, advantages=advantages.float(), returns=returns.float(), old_values=values
    )
    return estimated, sums if finite else None


def _split(
    rows: torch.Tensor,
    mini_data: UpdateData,
    s: UpdateSettings,
    plan: PassPlan | None,
    opening: SharedOpening | None,
) -> list[torch.Tensor]:
    """``rows`` (indices into the mini-batch, longest first) cut into micro-batches: of
    ``trainer.micro_batch_size`` rows, or of what the pass's ``plan`` fits of them (after
    ``opening``'s shared tokens); none when ``rows`` is empty."""
    if plan is None or not len(rows):
        return [m for m in rows.split(s.trainer.micro_batch_size) if len(m)]
    prefix = 0 if opening is None else opening.length
    sizes = plan.sizes(mini_data.attention_mask[rows], mini_data.loss_mask[rows], prefix)
    return list(rows.split(sizes))


def micro_batches(
    mini_data: UpdateData,
    s: UpdateSettings,
    plan: PassPlan | None = None,
    openings: Openings | None = None,
) -> list[tuple[torch.Tensor, bool]]:
    """This rank's micro-batches of a mini-batch: (row indices, counts); cut to the pass's
    ``plan`` where it has one (after the ``openings``' shared tokens).

    With sharded models every pass is a collective (each layer's weights are gathered, its
    gradient reduced), so every rank runs as many passes as the rank with the most rows
    (``ceil(rows / W)``); the others add passes over row 0 that do not count (weight 0).
    """
    rows = len(mini_data.input_ids)
    mine = distributed.shard(rows)
    opening = None if openings is None else openings.policy
    chunks = _split(torch.arange(mine.start, mine.stop), mini_data, s, plan, opening)
    micros = [(m, True) for m in chunks]
    if s.sharded:
        most = -(-rows // distributed.world_size())
        passes = -(-most // s.trainer.micro_batch_size)
        micros += [(torch.tensor([0]), False)] * (passes - len(micros))
    return micros


def _backward_share(policy, critic, mini_data: UpdateData, p: _MiniPass) -> dict[str, float] | None:
    """Back-propagate this rank's share of a mini-batch (all of it in one process), micro-batch
    by micro-batch (cut to the pass's plan), adding the micro-batch stats to its tally.
    Returns the share's part of the ``_ADDITIVE`` stats, or None when a loss was not
    finite."""
    sums: dict[str, float] = defaultdict(float)
    finite = True
    mine = len(distributed.shard(len(mini_data.input_ids))) > 0
    openings = Openings.of(policy, critic, mini_data, mine, p.s, p.autocast)
    own_critic = critic is not None and not reads_policy_pass(policy, critic)
    plan = p.for_pass(policy=True, critic=own_critic)
    micros = micro_batches(mini_data, p.s, plan, openings)
    for micro, counts in micros:
        part = mini_data.rows(micro)
        with phases.timed(phases.UPDATE_FORWARD), p.autocast:
            terms, stats = micro_terms(policy, critic, part, p.s, p.norm, openings)
        loss = total(terms)
        if not counts:
            with phases.timed(phases.UPDATE_BACKWARD):
                (loss * 0.0).backward()  # only for the collectives: adds zero to every gradient
            continue
        finite = finite and bool(torch.isfinite(loss))
        # Back-propagated even when not finite (the step is skipped anyway): with sharded
        # models the other ranks wait for this pass's gradient reduction.
        with phases.timed(phases.UPDATE_BACKWARD):
            loss.backward()
        if finite:
            for key in _ADDITIVE:
                if key in stats:
                    sums[key] += stats.pop(key)
            p.tally.add(stats, float(part.loss_mask.sum()))
    openings.backward()
    return sums if finite else None


def _backward_mini(policy, critic, mini_data: UpdateData, p: _MiniPass) -> dict[str, float] | None:
    """Back-propagate this rank's share of a mini-batch: both models micro-batch by
    micro-batch, or, when the mini-batch comes without advantages, the critic first (see
    ``_critic_first``), then the policy. Returns the share's ``_ADDITIVE`` stats, or None
    when a loss was not finite."""
    if mini_data.advantages is not None:
        return _backward_share(policy, critic, mini_data, p)
    mini_data, critic_sums = _critic_first(critic, mini_data, p)
    sums = _backward_share(policy, None, mini_data, p)
    return None if sums is None or critic_sums is None else sums | critic_sums


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

    Each epoch splits the shuffled episodes into mini-batches of ``mini_batch_size`` (with
    all their turn samples when rows are such), the last one holding the rest; a batch
    smaller than ``mini_batch_size`` (a filter that keeps a varying number of groups kept
    few) is one mini-batch, so one optimiser step."""
    tally, skipped, steps = _Tally(), 0, 0
    totals: dict[str, float] = defaultdict(float)  # this rank's shares of _ADDITIVE stats
    autocast = (
        torch.autocast(data.input_ids.device.type, dtype=s.autocast_dtype)
        if s.autocast_dtype is not None
        else nullcontext()
    )
    policy.train()
    t = s.trainer
    plan = MemoryPlan.of(policy, critic, optimizers, t.micro_batch_size) if s.plan_memory else None
    rows = mini_batch_rows(
        data.attention_mask, t.ppo_epochs, t.mini_batch_size, seed, data.episodes
    )
    for mini in rows:
        mini_data = data.rows(mini)
        norm = normaliser(mini_data.loss_mask, s.algo.aggregation())
        if norm == 0:
            continue  # nothing sampled in this mini-batch: no gradient to take
        for opt in optimizers.values():
            opt.zero_grad(set_to_none=True)
        sums = _backward_mini(policy, critic, mini_data, _MiniPass(s, norm, autocast, tally, plan))
        with phases.timed(phases.UPDATE_OPTIMIZER):
            finite = distributed.all_true(sums is not None)  # one rank's NaN: all skip
            if not s.sharded:  # FSDP2 summed them during the backward
                distributed.sum_gradients(_trainable(policy, critic))
            # of the summed, whole-batch gradient
            norms = _clip(policy, critic, s.trainer.grad_clip)
            finite = finite and all(math.isfinite(n) for n in norms.values())
            if finite:
                for opt in optimizers.values():
                    opt.step()
        if finite:
            assert sums is not None  # all_true above is False on a rank without sums
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
    if plan is not None:  # passes whose micro-batches free memory cut, over every rank
        cuts = distributed.sum_dicts({names.UPDATE_MEMORY_CUTS: float(plan.cuts)})
        metrics[names.UPDATE_MEMORY_CUTS] = cuts[names.UPDATE_MEMORY_CUTS]
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
