"""The StarPO / StarPO-S step: rollout → filter → score → advantages → update.

``Trainer.step`` is one iteration of RAGEN's RL loop; the run loop (loop.py) drives it and
does what every run does around a step (evaluation, logging, monitor, checkpoints). Every
source of randomness of step ``s`` is derived from ``(config.trainer.seed, s)`` (the env
seeds, the sampling noise, the mini-batch order), so a run resumed from a checkpoint
replays exactly what the uninterrupted run would have done.

Under torchrun every process runs the step on its share of the groups (see distributed.py)
and gathers the rest, so every rank takes the same decisions. With ``trainer.parallel=fsdp``
the models are sharded over the processes (see fsdp.py), and every pass without gradients
runs inside ``fsdp.full_weights``.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from ragen import metric_names as names
from ragen import phases
from ragen.algos import (
    ESTIMATORS,
    METRICS,
    Coefficients,
    FilterRule,
    advantage_weights,
    estimate,
    sampled_entropy,
    select_groups,
    whiten,
)
from ragen.config import ROW_BY_ROW, AlgoConfig, Config
from ragen.host.memory import peak_rss, reset_peak_rss, trim_heap
from ragen.monitor.metrics import (
    credit_metrics,
    diversity_metrics,
    gigpo_turn_inputs,
    rollout_metrics,
)
from ragen.rollout.loop import EVAL_SEED_BASE, RolloutSpec, rollout
from ragen.rollout.samples import TurnSamples
from ragen.rollout.trajectory import Batch, Trajectory, collate
from ragen.train import distributed, fsdp, gradient_analysis, setup
from ragen.train.cuda import deterministic_attention, gpu_memory_metrics
from ragen.train.distributed import say
from ragen.train.preflight import import_estimator
from ragen.train.schedule import set_learning_rates
from ragen.train.scoring import score_batch
from ragen.train.state import RunState
from ragen.train.update import UpdateData, UpdateSettings, ppo_update


def step_env_seeds(seed: int, step: int, groups: int) -> list[int]:
    """The initial-state seeds of a training step: fresh each step, below the eval seeds."""
    rng = np.random.default_rng([seed, step])
    return [int(s) for s in rng.integers(0, EVAL_SEED_BASE, size=groups)]


def _peak_rss_metric(phase: str) -> dict[str, float]:
    """``perf/<phase>_peak_rss_gib``: the most host memory the process held at once during a
    step's ``phase`` (rollout or update), the models and optimiser states included; nothing
    where Linux's /proc cannot say."""
    peak = peak_rss()
    return {} if peak is None else {f"perf/{phase}_peak_rss_gib": peak / 2**30}


def batch_advantages(
    algo: AlgoConfig,
    *,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    values: torch.Tensor | None,
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    turn_ids: torch.Tensor | None = None,
    anchor_ids: torch.Tensor | None = None,
    turn_penalties: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns (B, T) of a whole kept batch by ``algo.estimator``, the
    advantages whitened over its sampled tokens when the algo whitens (as RAGEN's verl code
    does before the PPO loss; every rank holds all of the batch, so no collective). The
    returns stay raw: they are the critic's targets, in reward units. Shapes as `estimate`."""
    advantages, returns = estimate(
        algo.estimator,
        rewards=rewards,
        mask=mask,
        values=values,
        scores=scores,
        group_ids=group_ids,
        turn_ids=turn_ids,
        anchor_ids=anchor_ids,
        turn_penalties=turn_penalties,
        coefs=Coefficients.of(algo),
    )
    if algo.whitens():
        advantages = whiten(advantages, mask)
    return advantages, returns


def filter_ratio(config: Config, rollbacks: int) -> float:
    """The share of groups the std filter keeps: ``algo.filter_ratio``, or after a rollback
    ``monitor.rollback_filter_ratio`` when one is set. Derived from the run's state, never
    written into the config, so config.yaml stays what the user asked."""
    override = config.monitor.rollback_filter_ratio
    return override if rollbacks and override is not None else config.algo.filter_ratio


def filter_episodes(
    trajectories: list[Trajectory], config: Config, rollbacks: int = 0
) -> tuple[list[Trajectory], dict]:
    """The rollout filter (algo.filter_*) of a step's episodes, in group order: by default
    StarPO-S's, the share of groups whose returns vary most (``filter_ratio`` after
    ``rollbacks`` rollbacks); top_p, min_p and filter_include_zero=false may keep none.
    Returns the kept episodes and the filter's metrics."""
    a, n = config.algo, config.rollout.group_size
    rule = FilterRule.of(a, filter_ratio(config, rollbacks))
    per_episode = {  # what each METRICS quantity reads of an episode
        "return": lambda t: t.total_reward,
        "entropy": lambda t: float(
            sampled_entropy(torch.tensor(t.logprobs), torch.tensor(t.loss_mask))
        ),
        "length": lambda t: float(sum(t.loss_mask)),
    }[METRICS[rule.metric][0]]
    returns = torch.tensor([t.total_reward for t in trajectories]).view(-1, n)  # (G, N)
    values = torch.tensor([per_episode(t) for t in trajectories]).view(-1, n)  # (G, N)
    keep, metrics = select_groups(returns, rule, values)
    return [t for t in trajectories if keep[t.group]], metrics


class Trainer:
    """StarPO: the models it trains, what the rollout samples with, and its step. Building
    one loads the models and writes nothing; ``loop.RunLoop`` runs it in a run directory."""

    name = "train"  # the command: the progress bar's label, the checkpoints' writer
    watched = True  # whether monitor.enabled runs the collapse detector on its metrics

    def __init__(self, config: Config) -> None:
        self.config = config
        self.device = setup.start(config)
        # The estimator is user code, imported as the run starts: one that cannot be is
        # refused before a model loads rather than after the first rollout.
        import_estimator(config)
        self.m = setup.build_models(config, self.device)
        self.sampler, self.generator = setup.sampling(config, self.m, self.device)
        self.spec = RolloutSpec.from_config(config.rollout)
        self.update_dtype = setup.update_dtype(config, self.device)
        self.rollouts: list[Trajectory] | None = None
        self.rollouts_step = -1

    @property
    def steps(self) -> int:
        """Steps of the whole run."""
        return self.config.trainer.steps

    def progress(self, metrics: dict[str, float]) -> dict[str, str]:
        """What the progress bar shows of a step's metrics."""
        return {
            "reward": f"{metrics['rollout/reward_mean']:+.3f}",
            "success": f"{metrics['rollout/success']:.2f}",
        }

    def evaluates(self, step: int, last: bool) -> bool:
        """Whether ``step`` ends with an evaluation: every ``trainer.eval_every`` steps and
        after the last (none when it is 0)."""
        every = self.config.trainer.eval_every
        return every > 0 and ((step + 1) % every == 0 or last)

    # ------------------------------------------------------------------------ the step

    def step(self, step: int, state: RunState) -> tuple[dict[str, float], list[Trajectory]]:
        """One StarPO iteration up to the update; returns its metrics and the episodes it
        played. ``state``: the run's rollbacks (learning rates, filter) and stop counters."""
        metrics: dict[str, float] = {}
        phases.drain()  # what ran between steps (an evaluation, a checkpoint) is not a phase
        watching = reset_peak_rss()
        started, cuts = time.perf_counter(), self.generator.stats.memory_cuts
        trajectories = self.collect(step)
        metrics["time/rollout_s"] = time.perf_counter() - started
        # decode batches free memory cut: this step's samples may not repeat exactly
        metrics[names.MEMORY_CUTS] = float(self.generator.stats.memory_cuts - cuts)
        if watching:
            metrics.update(_peak_rss_metric("rollout"))
            reset_peak_rss()
        metrics["perf/threads"] = float(torch.get_num_threads())  # what the step's time ran on
        metrics.update(rollout_metrics(trajectories))
        metrics.update(diversity_metrics(trajectories))
        kept, filter_metrics = self.filter(trajectories, state.rollbacks)
        metrics.update(filter_metrics)
        inputs = self.turn_inputs(kept)  # built once: the gigpo metrics and the estimator
        metrics.update(self.credit_metrics(kept, inputs))
        started = time.perf_counter()
        if kept:
            state.empty_steps = 0
        if kept and not self.has_samples(kept):
            say(f"[step {step}] no kept episode reached its first reply: no update this step")
            metrics.update({"actor/optimizer_steps": 0.0, "time/update_s": 0.0})
        elif kept:
            data, weight_metrics = self.weigh(self.prepare(kept, turn_inputs=inputs), kept)
            metrics.update(weight_metrics)
            metrics.update(self.analyse_gradients(data, kept, step))
            metrics.update(self.update(data, step, state.rollbacks))
            skipped = metrics["actor/optimizer_steps"] == 0 and metrics["actor/skipped_steps"] > 0
            state.note_skipped(step, skipped, "trainer.actor_lr")
            analysis_s = metrics.get("time/gradient_analysis_s", 0.0)
            metrics["time/update_s"] = time.perf_counter() - started - analysis_s
            metrics["perf/train_tokens_per_s"] = float(data.attention_mask.sum()) / max(
                metrics["time/update_s"], 1e-9
            )
            if watching:
                metrics.update(_peak_rss_metric("update"))
        else:
            metrics.update(self.skip_update(step, state))
        metrics.update({phases.metric(name): s for name, s in phases.drain().items()})
        metrics.update(gpu_memory_metrics(self.device))
        return metrics, trajectories

    # ------------------------------------------------------------------------ the stages

    def collect(self, step: int) -> list[Trajectory]:
        """Fresh rollouts at the first step of each ``rollout.reuse_k`` window; the same set
        again on the window's other steps ("online-k"). Each rank plays its share of the
        groups; every rank returns all of them, in group order."""
        c, t = self.config, self.config.trainer
        first = step - step % c.rollout.reuse_k
        if self.rollouts is None or self.rollouts_step != first:
            self.rollouts_step = first
            seeds = step_env_seeds(t.seed, first, c.rollout.groups)
            mine = distributed.shard(len(seeds))
            self.sampler.refresh()
            with fsdp.full_weights(self.m.policy):  # ranks generate different numbers of times
                played = rollout(
                    self.generator,
                    self.m.tokenizer,
                    c.env.name,
                    seeds[mine.start : mine.stop],
                    c.rollout.group_size,
                    self.spec,
                    env_options=c.env.options,
                    sample_seed=t.seed * 1_000_003 + first,
                    first_group=mine.start,
                )
            # the filter, the advantages and the metrics see every group, on every rank
            self.rollouts = distributed.gather_list(played)
        return self.rollouts

    def filter(
        self, trajectories: list[Trajectory], rollbacks: int = 0
    ) -> tuple[list[Trajectory], dict]:
        """The rollout filter of the run's config (``filter_episodes``)."""
        return filter_episodes(trajectories, self.config, rollbacks)

    def weigh(self, data: UpdateData, kept: list[Trajectory]) -> tuple[UpdateData, dict]:
        """RAGEN-2's weights on the kept episodes' advantages (algo.filter_loss_scaling,
        algo.soft_advantage_reweight; ``advantage_weights``), and their metrics; ``data``
        as it is when both are off."""
        a = self.config.algo
        if a.filter_loss_scaling == "none" and not a.soft_advantage_reweight:
            return data, {}
        assert data.advantages is not None  # critic_first is False when weights apply
        weights = advantage_weights(
            torch.tensor([t.total_reward for t in kept]),
            torch.tensor([t.group for t in kept]),
            kept_share=len({t.group for t in kept}) / self.config.rollout.groups,
            loss_scaling=a.filter_loss_scaling,
            soft=a.soft_advantage_reweight,
        )  # (B,)
        metrics = {
            "filter/weight_mean": float(weights.mean()),
            "filter/weight_min": float(weights.min()),
        }
        if data.episodes is not None:  # rows are turn samples: each takes its episode's
            weights = weights.to(data.episodes.device)[data.episodes]
        advantages = data.advantages * weights.to(data.advantages)[:, None]  # (B, T)
        return replace(data, advantages=advantages), metrics

    def has_samples(self, kept: list[Trajectory]) -> bool:
        """Whether ``kept`` holds a reply to train. With a context window other than full
        the rows are turn samples, and an episode whose opening left no room for a reply
        (ended truncated:context) has none; the full window trains such a batch as a row
        without sampled tokens, to zero advantages and skipped mini-batches."""
        return self.spec.context_window == "full" or any(t.turns for t in kept)

    def skip_update(self, step: int, state: RunState) -> dict[str, float]:
        """A step whose filter kept no group (filter/empty): nothing to learn from, so no
        update, the same on every rank, which all filter the same gathered groups;
        algo.filter_empty_stop_steps such steps in a row end the run."""
        say(f"[step {step}] the filter kept no group: no update this step")
        state.empty_steps += 1
        limit = self.config.algo.filter_empty_stop_steps
        if limit and state.empty_steps >= limit:
            say(
                f"[step {step}] the filter kept no group {state.empty_steps} steps in a row "
                f"(algo.filter_empty_stop_steps={limit}): the run stops here"
            )
            state.stop(step, f"algo.filter_empty_stop_steps={limit}")
        return {"actor/optimizer_steps": 0.0, "time/update_s": 0.0}

    def prepare(
        self,
        kept: list[Trajectory],
        estimate: bool = False,
        turn_inputs: dict[str, torch.Tensor] | None = None,
    ) -> UpdateData:
        """Collate, score (old log-probs in the update's dtype, reference, values), and
        compute advantages: of the whole batch, on every rank (batch statistics are global).
        ``estimate``: the advantages even where the update would estimate them itself.
        ``turn_inputs``: ``turn_inputs(kept)`` when the caller has built it already.

        With a context window other than full the update's rows are the turn samples
        (rollout/samples.py): they are scored, and their values placed back on the
        episodes' rows, on which the advantages are estimated as with the full window."""
        c = self.config
        pad = self.m.tokenizer.pad_token_id
        episodes = collate(kept, pad, c.rollout.reward_placement)
        samples = TurnSamples.of(kept) if self.spec.context_window != "full" else None
        batch = episodes if samples is None else samples.batch(episodes, pad)
        ids = batch.input_ids.to(self.device)
        mask = batch.attention_mask.to(self.device)
        loss_mask = batch.loss_mask.to(self.device)
        rewards = batch.rewards.to(self.device)
        on_policy = self.on_policy(len(kept))
        critic_first = self.critic_first(len(kept)) and not estimate
        with phases.timed(phases.SCORE):
            scored = self.score(ids, mask, loss_mask, policy=not on_policy, critic=not critic_first)
        if critic_first:  # the update trains the critic first and estimates from its values
            return UpdateData(
                input_ids=ids,
                attention_mask=mask,
                loss_mask=loss_mask,
                advantages=None,
                returns=None,
                old_logprobs=None,
                ref_logprobs=scored["ref_logprobs"],
                old_values=None,
                rewards=rewards,
                rollout_logprobs=batch.logprobs.to(self.device),
            )
        with phases.timed(phases.ADVANTAGES):
            if turn_inputs is None:
                turn_inputs = self.turn_inputs(kept)
            advantages, returns = self.advantages(episodes, samples, scored["values"], turn_inputs)
        return UpdateData(
            input_ids=ids,
            attention_mask=mask,
            loss_mask=loss_mask,
            advantages=advantages.float(),
            returns=returns.float(),
            old_logprobs=scored["old_logprobs"],
            ref_logprobs=scored["ref_logprobs"],
            old_values=scored["values"],
            rollout_logprobs=batch.logprobs.to(self.device),
            episodes=None if samples is None else samples.episode.to(self.device),
        )

    def advantages(
        self,
        episodes: Batch,
        samples: TurnSamples | None,
        values: torch.Tensor | None,
        turn_inputs: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages and returns of the update's rows, estimated on the ``episodes``' rows
        (``batch_advantages``, with the kept episodes' ``turn_inputs``). With turn
        ``samples`` (the rows when the context window is not full), their ``values`` are
        placed on the episodes' rows first, and the results cut back into the samples:
        (R, W), else (B, T) as ``values``."""
        d = self.device
        if samples is not None and values is not None:
            values = samples.to_episodes(values, episodes.input_ids.shape)
        advantages, returns = batch_advantages(
            self.config.algo,
            rewards=episodes.rewards.to(d),
            mask=episodes.loss_mask.to(d),
            values=values,
            scores=episodes.scores.to(d),
            group_ids=episodes.group_ids.to(d),
            turn_ids=episodes.turn_ids.to(d),
            **turn_inputs,
        )
        if samples is None:
            return advantages, returns
        return samples.to_samples(advantages), samples.to_samples(returns)

    def turn_inputs(self, kept: list[Trajectory]) -> dict[str, torch.Tensor]:
        """The per-turn estimator inputs of the kept episodes, each (B, M), for an estimator
        that reads them (gigpo, or a module:function one, which may); none for ragen's
        others: ``anchor_ids`` and ``turn_penalties`` (each turn's format term)."""
        a = self.config.algo
        if a.estimator in ESTIMATORS and a.estimator != "gigpo":
            return {}
        inputs = gigpo_turn_inputs(kept, a.gigpo_similarity)
        return {key: value.to(self.device) for key, value in inputs.items()}

    def credit_metrics(
        self, kept: list[Trajectory], turn_inputs: dict[str, torch.Tensor] | None = None
    ) -> dict[str, float]:
        """gigpo: its anchor groups and the size of its two terms over the kept episodes
        (``monitor.metrics.credit_metrics``, from ``turn_inputs(kept)`` when given); nothing
        for the other estimators."""
        a = self.config.algo
        if a.estimator != "gigpo":
            return {}
        return credit_metrics(
            kept,
            gamma=a.gigpo_gamma,
            step_weight=a.gigpo_step_weight,
            norm_by_std=a.gigpo_mode == "mean_std_norm",
            similarity=a.gigpo_similarity,
            turn_inputs=turn_inputs,
        )

    def critic_first(self, kept: int) -> bool:
        """Whether the update of ``kept`` episodes trains the critic before the policy and
        estimates the advantages from its values (on-policy, a row-by-row estimator): no
        scoring pass for the values. Not when ``algo.filter_loss_scaling`` weighs the
        advantages: ``weigh`` scales them before the update, so a values pass gives them.
        Nor with a context window other than full: an episode's advantages then read the
        values of all its turn samples, which are rows of their own."""
        a = self.config.algo
        return (
            self.on_policy(kept)
            and self.m.critic is not None
            and a.estimator in ROW_BY_ROW
            and a.filter_loss_scaling == "none"
            and self.spec.context_window == "full"
        )

    def on_policy(self, kept: int) -> bool:
        """Whether the update of ``kept`` episodes is exactly on-policy and takes its old
        log-probs (and values) from its own forward: one epoch, one mini-batch, whole weights
        on every process (sharded passes are collectives the shortcut does not line up).
        Its own forward runs the same weights on the same rows as a scoring pass would."""
        t = self.config.trainer
        return (
            t.ppo_epochs == 1 and kept <= t.mini_batch_size and not fsdp.is_sharded(self.m.policy)
        )

    def score(
        self, ids, mask, loss_mask, *, policy: bool = True, critic: bool = True
    ) -> dict[str, torch.Tensor | None]:
        """``score_batch`` of the (B, T) batch: each rank scores its share of the rows, and
        every rank gets all of them. ``policy``/``critic`` False: leave that model's scores
        to the update (None)."""
        rows = distributed.shard(len(ids))
        part = slice(rows.start, rows.stop)
        # shares differ by a row: ranks may run different numbers of micro-batches
        with fsdp.full_weights(*self.m.scorers()), setup.autocast(self.device, self.update_dtype):
            scored = score_batch(
                self.m.policy if policy else None,
                self.m.critic if critic else None,
                self.m.ref,
                ids[part],
                mask[part],
                loss_mask[part],
                temperature=self.config.rollout.temperature,
                micro_batch=self.config.trainer.micro_batch_size,
                share_opening=not fsdp.is_sharded(self.m.policy),
            )
        return {
            key: None if value is None else distributed.assemble_rows(value, rows, len(ids))
            for key, value in scored.items()
        }

    def settings(self) -> UpdateSettings:
        """What the update reads besides its batch; on a CPU the update cuts its micro-batches
        to the memory free (update_memory.py)."""
        sharded = fsdp.is_sharded(self.m.policy)
        return UpdateSettings(
            algo=self.config.algo,
            trainer=self.config.trainer,
            temperature=self.config.rollout.temperature,
            autocast_dtype=self.update_dtype,
            sharded=sharded,
            plan_memory=self.device.type == "cpu" and not sharded,
        )

    def analyse_gradients(
        self, data: UpdateData, kept: list[Trajectory], step: int
    ) -> dict[str, float]:
        """RAGEN-2's gradient reporter (gradient_analysis.py) on the steps
        trainer.gradient_analysis_every picks: per reward-variance bucket of the kept groups,
        each loss term's gradient norm, leaving the step as it would be without it."""
        t = self.config.trainer
        if not gradient_analysis.due(t.gradient_analysis_every, step):
            return {}
        started = time.perf_counter()
        with (
            gradient_analysis.untouched_random_state(self.device),
            deterministic_attention(self.device, t.deterministic),
            phases.untimed(),  # its own time, apart: time/gradient_analysis_s
        ):
            if data.advantages is None:  # the update estimates them: the reporter needs them now
                data = self.prepare(kept, estimate=True)
            returns = torch.tensor([episode.total_reward for episode in kept])
            groups = torch.tensor([episode.group for episode in kept])
            metrics = gradient_analysis.bucket_norms(
                self.m.policy,
                self.m.critic,
                data,
                returns,
                groups,
                self.settings(),
                t.gradient_analysis_buckets,
            )
        metrics["time/gradient_analysis_s"] = time.perf_counter() - started
        return metrics

    def update(self, data: UpdateData, step: int, rollbacks: int = 0) -> dict[str, float]:
        """The PPO update of ``data`` at ``step``, at the learning rates of the schedule
        after ``rollbacks`` rollbacks; returns its metrics."""
        t = self.config.trainer
        scale = set_learning_rates(self.m.optimizers, self.config, step, rollbacks)
        m, settings, seed = self.m, self.settings(), t.seed + step
        with deterministic_attention(self.device, t.deterministic):
            metrics = ppo_update(m.policy, m.critic, m.optimizers, data, settings, seed=seed)
        metrics["actor/lr"] = t.actor_lr * scale
        # The update's activations were freed into glibc's heap, which keeps them: return
        # them, or every later rollout and evaluation sizes its decode batches to a machine
        # that looks gigabytes fuller than it is.
        trim_heap()
        return metrics
