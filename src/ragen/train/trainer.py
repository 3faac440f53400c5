"""The StarPO / StarPO-S training loop.

One iteration: rollout → filter → score → advantages → update → log → checkpoint → evaluate.
Every source of randomness of step ``s`` is derived from ``(trainer.seed, s)`` (the env
seeds, the sampling noise, the mini-batch order), so a run resumed from a checkpoint
replays exactly what the uninterrupted run would have done.

Under torchrun every process runs this loop on its share of the groups (see distributed.py);
rank 0 logs, writes the run directory and checkpoints, and decides when to stop. With
``trainer.parallel=fsdp`` the models are sharded over the processes (see fsdp.py), and every
pass without gradients runs inside ``fsdp.full_weights``.
"""

from __future__ import annotations

import copy
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ragen import models, phases
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
from ragen.algos.gigpo import anchor_ids
from ragen.config import ROW_BY_ROW, AlgoConfig, Config, ConfigError, to_dict
from ragen.host import threads
from ragen.host.memory import trim_heap
from ragen.monitor.collapse import Alert, CollapseDetector
from ragen.monitor.metrics import diversity_metrics, rollout_metrics
from ragen.monitor.template import sample_pairs, template_collapse_metrics
from ragen.rollout.engines import make_generator
from ragen.rollout.loop import EVAL_SEED_BASE, RolloutSpec, rollout
from ragen.rollout.trajectory import Trajectory, collate
from ragen.run.jsonl import RunDirError, append_jsonl, read_jsonl, rewrite_jsonl
from ragen.run.metrics_logger import MetricsLogger
from ragen.run.rundir import BEFORE_TRAINING, RunDir
from ragen.train import checkpoint, distributed, fsdp
from ragen.train.evaluator import EvalRequest, evaluate
from ragen.train.generation_weights import COPYING_BACKENDS, GenerationWeights
from ragen.train.preflight import import_estimator
from ragen.train.schedule import lr_scale
from ragen.train.scoring import policy_logprobs, score_batch
from ragen.train.update import UpdateData, UpdateSettings, ppo_update


def step_env_seeds(seed: int, step: int, groups: int) -> list[int]:
    """The initial-state seeds of a training step: fresh each step, below the eval seeds."""
    rng = np.random.default_rng([seed, step])
    return [int(s) for s in rng.integers(0, EVAL_SEED_BASE, size=groups)]


def resolve_device(name: str) -> torch.device:
    """``trainer.device`` as a device; ``auto`` is CUDA when there is one. Under torchrun
    each process takes the GPU of its ``LOCAL_RANK``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = distributed.local_device(torch.device(name))
    if device.type == "cuda" and device.index is not None:
        # the current device is what torch.cuda.synchronize (phase timings) and new
        # allocations without a device use: cuda:N, not GPU 0
        torch.cuda.set_device(device)
    return device


def use_deterministic_kernels(device: torch.device, on: bool) -> None:
    """Make the CUDA kernels of this process deterministic, or leave torch's default."""
    if device.type != "cuda":
        return
    if on:  # cuBLAS reads it when it makes its first handle; torch checks it on every matmul
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: an op without a deterministic kernel warns and runs rather than end the run
    torch.use_deterministic_algorithms(on, warn_only=True)


def deterministic_attention(device: torch.device, on: bool):
    """A context for the update: on CUDA with ``on``, attention on SDPA's math kernels.

    cuDNN's fused attention adds in a varying order in its backward, and torch's warn-only
    deterministic mode warns and runs it: on an H200 a resumed run's weights came out a few
    bits off the uninterrupted run's (docs/gpu.md). The math kernels are plain matrix
    products and a softmax.
    Forwards alone (rollouts, scoring) add in a fixed order and keep the fused kernels.
    """
    if device.type != "cuda" or not on:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


def gpu_memory_metrics(device: torch.device) -> dict[str, float]:
    """``perf/gpu_peak_gib``: the most GPU memory torch held at once since the last call
    (so, per step), on a CUDA device; nothing on a CPU."""
    if device.type != "cuda":
        return {}
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    torch.cuda.reset_peak_memory_stats(device)
    return {"perf/gpu_peak_gib": peak}


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
        coefs=Coefficients.of(algo),
    )
    if algo.whitens():
        advantages = whiten(advantages, mask)
    return advantages, returns


def say(line: str) -> None:
    """Print a line of the run's story, once (from rank 0)."""
    if distributed.is_main():
        tqdm.write(line)


@dataclass
class Models:
    """What the loop trains and samples with."""

    policy: torch.nn.Module
    tokenizer: Any  # a transformers tokenizer (PreTrainedTokenizerBase), used duck-typed
    critic: torch.nn.Module | None
    ref: object  # callable (ids, mask, loss_mask) -> (B, T) log-probs; None when KL is off
    optimizers: dict[str, torch.optim.Optimizer]
    ref_model: torch.nn.Module | None = None  # the reference's own copy, if it has one

    def scorers(self) -> tuple[torch.nn.Module | None, ...]:
        """The models a scoring pass runs: policy, critic, reference copy (None if absent)."""
        return self.policy, self.critic, self.ref_model


def sharded(config: Config) -> bool:
    """Whether this run shards its models: trainer.parallel=fsdp over several processes."""
    return config.trainer.parallel == "fsdp" and distributed.world_size() > 1


def build_models(config: Config, device: torch.device) -> Models:
    """Policy (float32 master weights, LoRA if asked), critic from the same LM, optimisers;
    each model sharded (before its optimiser takes its parameters) if the run shards."""
    m, t, a = config.model, config.trainer, config.algo
    policy, tokenizer = load_master_policy(config, device)
    copied = None
    if a.trains_critic() and m.critic_body == "copy":
        copied = models.ValueModel(copy.deepcopy(policy), m.critic_layers).to(device)
    if m.lora_rank > 0:
        policy = models.apply_lora(policy, m.lora_rank, m.lora_alpha, m.lora_targets)
        if copied is not None:
            copied.body = models.apply_lora(copied.body, m.lora_rank, m.lora_alpha, m.lora_targets)
    critic: models.ValueModel | models.TrunkValueHead | None = copied
    if a.trains_critic() and m.critic_body == "policy":
        critic = models.TrunkValueHead(policy).to(device)  # on the decoder LoRA adapts, if any
    ref, ref_model = _reference(policy, a.kl_coef, config.rollout.temperature)
    if sharded(config):
        for model in (policy, critic, ref_model):
            if model is not None:
                fsdp.shard(model)
    optimizers: dict[str, torch.optim.Optimizer] = {"actor": adamw(policy, t.actor_lr, config)}
    if critic is not None:
        optimizers["critic"] = adamw(critic, t.critic_lr, config)
    return Models(policy.eval(), tokenizer, critic, ref, optimizers, ref_model)


def load_master_policy(config: Config, device: torch.device):
    """(policy, tokenizer) of ``model.spec`` in float32 master weights on ``device``, before
    any LoRA; the trainer's seed fixes whatever the load initialises."""
    m = config.model
    return models.load_policy(
        m.spec,
        dtype="float32",
        device=str(device),
        allow_download=m.allow_download,
        seed=config.trainer.seed,
        trust_remote_code=m.trust_remote_code,
    )


def adamw(model: torch.nn.Module, lr: float, config: Config) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, with the trainer's betas and weight decay."""
    t = config.trainer
    params = [p for p in model.parameters() if p.requires_grad]
    betas = (t.adam_beta1, t.adam_beta2)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=t.weight_decay)


def _reference(policy, kl_coef: float, temperature: float):
    """The frozen reference policy for the KL term and its own copy of the model: (None, None)
    when the term is off. With LoRA the reference is the policy with its adapters switched
    off: no second copy (None)."""
    if kl_coef <= 0:
        return None, None
    if hasattr(policy, "disable_adapter"):
        model, context = policy, policy.disable_adapter
    else:
        model, context = copy.deepcopy(policy).requires_grad_(False), nullcontext

    def ref_logprobs(ids, mask, sampled):
        with context():
            return policy_logprobs(
                model, ids, mask, sampled, temperature=temperature, with_entropy=False
            )[0]

    return ref_logprobs, None if model is policy else model


def out_of_budget(elapsed: float, steps_done: int, budget: float) -> bool:
    """Whether one more step, at the mean pace of the ``steps_done`` steps that took
    ``elapsed`` seconds, would end past ``budget`` seconds."""
    return elapsed + elapsed / max(1, steps_done) > budget


class Trainer:
    """Owns the models, the run directory and the step counter."""

    name = "train"  # of the progress bar
    watched = True  # whether monitor.enabled runs the collapse detector on this loop

    def __init__(self, config: Config, run: RunDir, *, resume: bool = False) -> None:
        self.config, self.run = config, run
        self.device = resolve_device(config.trainer.device)
        use_deterministic_kernels(self.device, config.trainer.deterministic)
        torch.manual_seed(config.trainer.seed)
        if config.trainer.parallel == "fsdp" and distributed.world_size() == 1:
            say("trainer.parallel=fsdp has no effect in one process: nothing to shard over")
        self.m = self.build()
        self.sampler = GenerationWeights(self.m.policy, self._generation_dtype())
        self.generator = make_generator(
            config.rollout.backend,
            self.sampler.model,
            self.m.tokenizer,
            attention=config.model.attention,
        )
        self.spec = RolloutSpec.from_config(config.rollout)
        watch = config.monitor.enabled and self.watched
        self.detector = CollapseDetector(config.monitor) if watch else None
        self.rollbacks = 0
        self.stopped_at: int | None = None  # last step: monitor.action=stop or max_minutes
        self.eval_success: float | None = None  # mean eval success of the latest evaluation
        self.empty_steps = 0  # steps in a row whose filter kept no group
        self.skipped_steps = 0  # steps in a row whose every update was skipped (not finite)
        self.diverged: str | None = None  # why the run stopped on non-finite updates
        self.start_step = self._resume() if resume else 0
        self.started = time.monotonic()  # max_minutes counts from here; train() restarts it
        self.rollouts: list[Trajectory] | None = None
        self.rollouts_step = -1

    def build(self) -> Models:
        """The models and optimisers this loop trains; first the estimator is imported (user
        code, imported as the run starts), so one that cannot be is refused before a model
        loads rather than after the first rollout."""
        import_estimator(self.config)
        return build_models(self.config, self.device)

    @property
    def steps(self) -> int:
        """Steps of the whole run."""
        return self.config.trainer.steps

    # ------------------------------------------------------------------------ the loop

    def train(self) -> None:
        main = distributed.is_main()
        if self.config.trainer.eval_before and self.start_step == 0:
            # Not the rollback target's figure (eval_success): no checkpoint holds this policy.
            self.evaluate_policy(BEFORE_TRAINING)
        # The budget is the training's: the evaluation before it does not count against it.
        self.started = time.monotonic()
        with (
            self._logger() if main else nullcontext() as log,  # rank 0 writes the run directory
            tqdm(
                total=self.steps,
                initial=self.start_step,
                desc=self.name,
                unit="step",
                disable=not (self.config.logging.progress and main),
            ) as bar,
            self.thread_follower() as follow,
        ):
            for step in range(self.start_step, self.steps):
                follow()
                bar.set_postfix(self.progress(self.step(step, log)))
                bar.update(1)
                if self.stopped_at is not None:
                    break

    def thread_follower(self) -> threads.Follower:
        """What sets torch's threads before each step (``threads.Follower``); a backend
        that samples with this process's model keeps the whole run in this process."""
        whole_run = self.config.rollout.backend in COPYING_BACKENDS
        return threads.Follower(self.config.trainer.threads, say=say, whole_run=whole_run)

    def progress(self, metrics: dict[str, float]) -> dict[str, str]:
        """What the progress bar shows of a step's metrics."""
        return {
            "reward": f"{metrics['rollout/reward_mean']:+.3f}",
            "success": f"{metrics['rollout/success']:.2f}",
        }

    def is_last(self, step: int) -> bool:
        """The run's final step: the configured count, a stop, or the wall-clock budget."""
        t = self.config.trainer
        out_of_time = t.max_minutes > 0 and out_of_budget(
            time.monotonic() - self.started, step + 1 - self.start_step, 60 * t.max_minutes
        )
        out_of_time = distributed.broadcast(out_of_time)  # rank 0's clock: every rank agrees
        if out_of_time and self.stopped_at is None:
            say(f"[step {step}] trainer.max_minutes={t.max_minutes:g} reached: last step")
            self.stopped_at = step
        return step + 1 == self.steps or self.stopped_at == step

    def step(self, step: int, log: MetricsLogger | None) -> dict[str, float]:
        """One StarPO iteration; returns the metrics it logged (``log`` is None off rank 0)."""
        metrics: dict[str, float] = {}
        phases.drain()  # what ran between steps (an evaluation, a checkpoint) is not a phase
        started = time.perf_counter()
        trajectories = self.collect(step)
        metrics["time/rollout_s"] = time.perf_counter() - started
        metrics["perf/threads"] = float(torch.get_num_threads())  # what the step's time ran on
        metrics.update(rollout_metrics(trajectories))
        metrics.update(diversity_metrics(trajectories))
        kept, filter_metrics = self.filter(trajectories)
        metrics.update(filter_metrics)
        started = time.perf_counter()
        if kept:
            self.empty_steps = 0
            data, weight_metrics = self.weigh(self.prepare(kept), kept)
            metrics.update(weight_metrics)
            metrics.update(self.update(data, step))
            skipped = metrics["actor/optimizer_steps"] == 0 and metrics["actor/skipped_steps"] > 0
            self.note_skipped(step, skipped, "trainer.actor_lr")
            metrics["time/update_s"] = time.perf_counter() - started
            metrics["perf/train_tokens_per_s"] = float(data.attention_mask.sum()) / max(
                metrics["time/update_s"], 1e-9
            )
        else:
            metrics.update(self.skip_update(step))
        metrics.update({phases.metric(name): s for name, s in phases.drain().items()})
        metrics.update(gpu_memory_metrics(self.device))
        last = self.is_last(step)  # decided once: the budget may pass during the evaluation
        metrics.update(self.maybe_measure_templates(step, trajectories))
        metrics.update(self.maybe_evaluate(step, last))
        self.record(step, log, metrics, trajectories)
        self.watch(step, metrics)
        self.maybe_checkpoint(step, last)
        return metrics

    def record(
        self,
        step: int,
        log: MetricsLogger | None,
        metrics: dict[str, float],
        trajectories: list[Trajectory],
    ) -> None:
        """Write a step's metrics and (if asked) its episodes; ``log`` is None off rank 0."""
        if log is None:
            return
        with self.run.writing(self.run.metrics):
            log.log(step, metrics)
        if self.config.logging.save_trajectories:
            with self.run.writing(self.run.trajectory_file(step)):
                log.log_episodes(step, [t.to_record() for t in trajectories])

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

    def filter(self, trajectories: list[Trajectory]) -> tuple[list[Trajectory], dict]:
        """The rollout filter (algo.filter_*): by default StarPO-S's, the share of groups
        whose returns vary most; top_p, min_p and filter_include_zero=false may keep none."""
        a, n = self.config.algo, self.config.rollout.group_size
        rule = FilterRule.of(a, self.filter_ratio)
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

    def weigh(self, data: UpdateData, kept: list[Trajectory]) -> tuple[UpdateData, dict]:
        """RAGEN-2's weights on the kept episodes' advantages (algo.filter_loss_scaling,
        algo.soft_advantage_reweight; ``advantage_weights``), and their metrics; ``data``
        as it is when both are off."""
        a = self.config.algo
        if a.filter_loss_scaling == "none" and not a.soft_advantage_reweight:
            return data, {}
        assert data.advantages is not None  # the config refuses the update's own estimate
        weights = advantage_weights(
            torch.tensor([t.total_reward for t in kept]),
            torch.tensor([t.group for t in kept]),
            kept_share=len({t.group for t in kept}) / self.config.rollout.groups,
            loss_scaling=a.filter_loss_scaling,
            soft=a.soft_advantage_reweight,
        )  # (B,)
        advantages = data.advantages * weights.to(data.advantages)[:, None]  # (B, T)
        metrics = {
            "filter/weight_mean": float(weights.mean()),
            "filter/weight_min": float(weights.min()),
        }
        return replace(data, advantages=advantages), metrics

    def note_skipped(self, step: int, skipped: bool, lr_key: str) -> None:
        """Count the steps in a row whose every update was skipped because the loss or the
        gradient norm was not finite; at NONFINITE_STOP_STEPS the weights will not move
        again, so the run stops (``diverged`` says why) instead of ending as if trained."""
        self.skipped_steps = self.skipped_steps + 1 if skipped else 0
        if self.skipped_steps < NONFINITE_STOP_STEPS or self.diverged is not None:
            return
        self.diverged = (
            f"[step {step}] every update of the last {self.skipped_steps} steps was skipped: "
            f"the loss or its gradient was not finite (a {lr_key} too large, or weights that "
            "are not finite); start a new run, or resume from a checkpoint before the trouble"
        )
        say(self.diverged)
        self.stopped_at = step

    def skip_update(self, step: int) -> dict[str, float]:
        """A step whose filter kept no group (filter/empty): nothing to learn from, so no
        update, the same on every rank, which all filter the same gathered groups;
        algo.filter_empty_stop_steps such steps in a row end the run."""
        say(f"[step {step}] the filter kept no group: no update this step")
        self.empty_steps += 1
        limit = self.config.algo.filter_empty_stop_steps
        if limit and self.empty_steps >= limit:
            say(
                f"[step {step}] the filter kept no group {self.empty_steps} steps in a row "
                f"(algo.filter_empty_stop_steps={limit}): the run stops here"
            )
            self.stopped_at = step
        return {"actor/optimizer_steps": 0.0, "time/update_s": 0.0}

    def prepare(self, kept: list[Trajectory]) -> UpdateData:
        """Collate, score (old log-probs in the update's dtype, reference, values), and
        compute advantages: of the whole batch, on every rank (batch statistics are global)."""
        c = self.config
        batch = collate(kept, self.m.tokenizer.pad_token_id, c.rollout.reward_placement)
        ids = batch.input_ids.to(self.device)
        mask = batch.attention_mask.to(self.device)
        loss_mask = batch.loss_mask.to(self.device)
        rewards = batch.rewards.to(self.device)
        on_policy = self.on_policy(len(kept))
        critic_first = self.critic_first(len(kept))
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
            advantages, returns = batch_advantages(
                c.algo,
                rewards=rewards,
                mask=loss_mask,
                values=scored["values"],
                scores=batch.scores.to(self.device),
                group_ids=batch.group_ids.to(self.device),
                turn_ids=batch.turn_ids.to(self.device),
                anchor_ids=self.anchors(kept),
            )
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
        )

    def anchors(self, kept: list[Trajectory]) -> torch.Tensor | None:
        """(B, M) anchor ids of the kept episodes' turns for an estimator that reads them
        (gigpo, or a module:function one, which may); None for ragen's others."""
        a = self.config.algo
        if a.estimator in ESTIMATORS and a.estimator != "gigpo":
            return None
        ids = anchor_ids(
            [[turn.anchor_key for turn in t.turns] for t in kept],
            [t.group for t in kept],
            a.gigpo_similarity,
        )
        return ids.to(self.device)

    def critic_first(self, kept: int) -> bool:
        """Whether the update of ``kept`` episodes trains the critic before the policy and
        estimates the advantages from its values (on-policy, a row-by-row estimator): no
        scoring pass for the values."""
        estimator = self.config.algo.estimator
        return self.on_policy(kept) and self.m.critic is not None and estimator in ROW_BY_ROW

    def on_policy(self, kept: int) -> bool:
        """Whether the update of ``kept`` episodes is exactly on-policy and may take its old
        log-probs (and values) from its own forward: one epoch, one mini-batch, whole weights
        on every process (sharded passes are collectives the shortcut does not line up),
        and ``trainer.scoring_pass`` auto."""
        t = self.config.trainer
        return (
            t.scoring_pass == "auto"
            and t.ppo_epochs == 1
            and kept <= t.mini_batch_size
            and not fsdp.is_sharded(self.m.policy)
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
        with fsdp.full_weights(*self.m.scorers()), self._autocast():
            scored = score_batch(
                self.m.policy if policy else None,
                self.m.critic if critic else None,
                self.m.ref,
                ids[part],
                mask[part],
                loss_mask[part],
                temperature=self.config.rollout.temperature,
                micro_batch=self.config.trainer.micro_batch_size,
                share_opening=self.config.trainer.prefix_sharing == "mini_batch"
                and not fsdp.is_sharded(self.m.policy),
            )
        return {
            key: None if value is None else distributed.assemble_rows(value, rows, len(ids))
            for key, value in scored.items()
        }

    def update(self, data: UpdateData, step: int) -> dict[str, float]:
        t = self.config.trainer
        settings = UpdateSettings(
            algo=self.config.algo,
            trainer=t,
            temperature=self.config.rollout.temperature,
            autocast_dtype=self._autocast_dtype(),
            sharded=fsdp.is_sharded(self.m.policy),
        )
        scale = self._set_learning_rates(step)
        with deterministic_attention(self.device, t.deterministic):
            metrics = ppo_update(
                self.m.policy, self.m.critic, self.m.optimizers, data, settings, seed=t.seed + step
            )
        metrics["actor/lr"] = t.actor_lr * scale
        # The update's activations were freed into glibc's heap, which keeps them: return
        # them, or every later rollout and evaluation sizes its decode batches to a machine
        # that looks gigabytes fuller than it is.
        trim_heap()
        return metrics

    def evaluates(self, step: int, last: bool) -> bool:
        """Whether ``step`` ends with an evaluation: every ``trainer.eval_every`` steps and
        after the last (none when it is 0)."""
        every = self.config.trainer.eval_every
        return every > 0 and ((step + 1) % every == 0 or last)

    def maybe_evaluate(self, step: int, last: bool = False) -> dict[str, float]:
        """Evaluate on fixed seeds at the eval temperature when ``evaluates`` says so."""
        if not self.evaluates(step, last):
            return {}
        metrics = self.evaluate_policy(step)
        successes = [v for k, v in metrics.items() if k.endswith("/success")]
        self.eval_success = sum(successes) / len(successes)
        return metrics

    def evaluate_policy(self, step: int) -> dict[str, float]:
        """Evaluate the policy as it is after ``step`` (BEFORE_TRAINING: as it starts) on
        every eval env; each summary goes to eval.jsonl, and its headline figures are
        returned as ``eval/<env>/<figure>`` metrics."""
        t = self.config.trainer
        metrics = {}
        self.sampler.refresh()
        for env in self.config.env.eval_names or [self.config.env.name]:
            request = EvalRequest(
                env=env,
                n=t.eval_episodes,
                k=t.eval_k,
                temperature=t.eval_temperature,
                split=t.eval_split,
            )
            with fsdp.full_weights(self.m.policy):  # the seeds are shared unevenly
                summary, _ = evaluate(
                    self.generator, self.m.tokenizer, self.config, request, progress=False
                )
            if distributed.is_main():
                with self.run.writing(self.run.evals):
                    append_jsonl(self.run.evals, [{"step": step, **summary}])
            figures = ("success", "pass_at_k", "reward_mean", "format_ok", "turns_mean")
            for key in (*figures, "action_template_share"):
                metrics[f"eval/{env}/{key}"] = summary[key]
            when = "before training" if step == BEFORE_TRAINING else f"step {step}"
            say(
                f"[{when}] eval {env}: success {summary['success']:.1%}, format-ok "
                f"{summary['format_ok']:.1%} ({request.n} seeds, T={request.temperature:g})"
            )
        return metrics

    def maybe_measure_templates(self, step: int, trajectories: list[Trajectory]) -> dict:
        """Every ``monitor.template_every`` steps: template collapse (RAGEN-2), the policy
        cross-scoring a sample of reasonings under each other's prompts. On rank 0, which
        logs and monitors."""
        mon = self.config.monitor
        if not mon.enabled or mon.template_every == 0 or (step + 1) % mon.template_every:
            return {}
        # every rank takes part in gathering the weights, then rank 0 alone runs the passes
        with fsdp.full_weights(self.m.policy):
            if not distributed.is_main():
                return {}
            pairs = sample_pairs(
                trajectories,
                self.m.tokenizer.decode,
                max_pairs=mon.template_pairs,
                seed=self.config.trainer.seed + step,
            )
            with self._autocast():
                return template_collapse_metrics(
                    self.m.policy, pairs, temperature=self.config.rollout.temperature or 1.0
                )

    def watch(self, step: int, metrics: dict[str, float]) -> list[Alert]:
        """Feed the step's metrics to the collapse detector; report alerts and act on them.
        The detector runs on rank 0 (which has every metric); every rank follows its call."""
        if self.detector is None:
            return []
        alerts = self.detector.update(step, metrics) if distributed.is_main() else []
        if alerts:
            with self.run.writing(self.run.alerts):
                append_jsonl(self.run.alerts, [a.to_record() for a in alerts])
            for alert in alerts:
                tqdm.write(alert.line())
        if distributed.broadcast(bool(self.detector.actionable(alerts))):
            self._act(step)
        return alerts

    def _act(self, step: int) -> None:
        """monitor.action on an actionable alert: nothing, stop, or roll back to the
        checkpoint with the best eval success and continue with the configured changes."""
        mon = self.config.monitor
        if mon.action == "warn":
            return
        target = distributed.broadcast(checkpoint.best_checkpoint(self.run))  # rank 0's choice
        if mon.action == "stop" or self.rollbacks >= mon.max_rollbacks or target is None:
            if mon.action == "stop":
                why = "monitor.action=stop"
            elif target is None:
                why = "no evaluated checkpoint to roll back to"
            else:
                why = f"monitor.max_rollbacks={mon.max_rollbacks} used"
            say(f"[step {step}] stopping the run ({why}); last checkpoint: step_{step + 1}")
            self.stopped_at = step
            return
        _check_visible(target)
        checkpoint.load_checkpoint(
            target, policy=self.m.policy, critic=self.m.critic, optimizers=self.m.optimizers
        )
        self.rollbacks += 1
        self._set_learning_rates(step + 1)
        say(
            f"[step {step}] rolled back to {target.name} (rollback {self.rollbacks} of "
            f"{mon.max_rollbacks}); learning rates x{mon.rollback_lr_scale**self.rollbacks:g}"
        )

    def _set_learning_rates(self, step: int) -> float:
        """Set both optimisers' rates for ``step`` from the configured ones (warm-up, then
        one cut per rollback), so a resumed run sets the same values; returns the scale."""
        mon, t = self.config.monitor, self.config.trainer
        scale = lr_scale(step, t.lr_warmup_steps, self.rollbacks, mon.rollback_lr_scale)
        base = {"actor": t.actor_lr, "critic": t.critic_lr}
        for name, opt in self.m.optimizers.items():
            for group in opt.param_groups:
                group["lr"] = base[name] * scale
        return scale

    @property
    def filter_ratio(self) -> float:
        """The share of groups the std filter keeps now: ``algo.filter_ratio``, or after a
        rollback ``monitor.rollback_filter_ratio`` when one is set. Derived from the run's
        state, never written into the config, so config.yaml stays what the user asked."""
        override = self.config.monitor.rollback_filter_ratio
        return (
            override if self.rollbacks and override is not None else self.config.algo.filter_ratio
        )

    def maybe_checkpoint(self, step: int, last: bool = False) -> None:
        """Save every ``trainer.save_every`` steps, on the last step, and when a monitor
        action stopped the run at this step."""
        t = self.config.trainer
        last = last or self.stopped_at == step
        # Every rank calls save_checkpoint: with sharded models each holds a part of the
        # weights and optimiser states, gathered onto rank 0, which writes.
        if last or (t.save_every and (step + 1) % t.save_every == 0):
            state = {
                "loop": self.name,
                "rollbacks": self.rollbacks,
                "eval_success": self.eval_success,
                "empty_steps": self.empty_steps,
            }
            if self.detector is not None:
                state["monitor"] = self.detector.state_dict()
            checkpoint.save_checkpoint(
                self.run,
                step + 1,
                policy=self.m.policy,
                tokenizer=self.m.tokenizer,
                critic=self.m.critic,
                optimizers=self.m.optimizers,
                state=state,
                keep=t.keep_checkpoints,
            )

    # ------------------------------------------------------------------------ helpers

    def _generation_dtype(self) -> torch.dtype:
        """What the rollout samples in: model.dtype, for the backends that sample with the
        trainer's own model and when it is not sharded (the vLLM engines pick their own; a
        sharded policy's weights are gathered for each rollout instead)."""
        c = self.config
        if c.rollout.backend not in COPYING_BACKENDS or fsdp.is_sharded(self.m.policy):
            return next(self.m.policy.parameters()).dtype
        return models.resolve_dtype(c.model.dtype, self.device)

    def _autocast_dtype(self) -> torch.dtype | None:
        dtype = models.resolve_dtype(self.config.trainer.update_dtype, self.device)
        return None if dtype == torch.float32 else dtype

    def _autocast(self):
        dtype = self._autocast_dtype()
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def _logger(self) -> MetricsLogger:
        c = self.config.logging
        with self.run.writing(self.run.tensorboard):
            return MetricsLogger(
                self.run,
                tensorboard=c.tensorboard,
                wandb=c.wandb,
                wandb_project=c.wandb_project,
                config=to_dict(self.config),
            )

    def _resume(self) -> int:
        """Load the newest checkpoint that loads (rank 0 lists them, every rank loads), saying
        which damaged ones it passed over; drop what the run logged after it (everything,
        when it has no checkpoint yet) so that each step is logged once."""
        folders = distributed.broadcast(checkpoint.checkpoint_folders(self.run))
        step = 0
        skipped: list[str] = []
        for path in reversed(folders):
            problem = distributed.broadcast(checkpoint.damage(path))
            if problem is None:
                _check_visible(path)
                problem = self._restore(path)
            if problem is None:
                step = int(path.name.removeprefix("step_"))
                if skipped:
                    say(f"resuming from {path.name}; skipped {'; '.join(skipped)}")
                break
            skipped.append(f"{path.name}: {problem}")
        else:
            if folders:
                raise RunDirError(
                    f"no checkpoint of {self.run.root} is intact ({'; '.join(skipped)}): "
                    "nothing to resume from; start a new run with --out"
                )
            say(f"{self.run.root} has no checkpoint yet: starting again from step 0")
        if distributed.is_main():
            checkpoint.sweep(self.run)
            truncate_after(self.run, step)
        return step

    def _restore(self, path) -> str | None:
        """Load the checkpoint at ``path`` into the models and the trainer; what went wrong
        if it does not load (the same answer on every rank)."""
        problem: str | None
        try:
            state = checkpoint.load_checkpoint(
                path, policy=self.m.policy, critic=self.m.critic, optimizers=self.m.optimizers
            )
        except checkpoint.LOAD_ERRORS as err:
            lines = str(err).strip().splitlines()
            problem = f"does not load ({type(err).__name__}: {lines[0] if lines else ''})"
        else:
            problem = None
        problems = [p for p in distributed.gather(problem) if p is not None]
        if problems:
            return problems[0]
        self.rollbacks = int(state.get("rollbacks", 0))
        self.eval_success = state.get("eval_success")
        self.empty_steps = int(state.get("empty_steps", 0))
        if self.detector is not None and "monitor" in state:
            self.detector.load_state_dict(state["monitor"])
        return None


NONFINITE_STOP_STEPS = 3
"""Steps in a row whose every update is skipped for a non-finite loss or gradient after
which a run stops: a learning rate that large never trains again."""

# Settings the checkpoints' tensors were shaped by: a resume cannot change them.
SHAPING_KEYS = ("model.spec", "model.lora_rank", "model.critic_body", "model.critic_layers")
LORA_KEYS = ("model.lora_alpha", "model.lora_targets")  # shaping too, when LoRA is on
# The game a run's checkpoints were trained on: its steps, logs and report are all of one
# game, so another is a new run (model.spec= a checkpoint), not a resume.
RUN_KEYS = ("env.name",)


def check_resume(run: RunDir, saved: Config, asked: Config, *, sft: bool = False) -> None:
    """Refuse a resume of ``run`` (trained with ``saved``) with settings its checkpoints
    cannot take (``asked``): another game, another model or LoRA, a critic added or dropped
    (RL runs), fewer steps than are done (``sft.steps`` for a `ragen sft` run). Reads only;
    raises ConfigError with one line naming the key and the fix."""
    keys = RUN_KEYS + SHAPING_KEYS + (LORA_KEYS if saved.model.lora_rank > 0 else ())
    for key in keys:
        section, name = key.split(".")
        before = getattr(getattr(saved, section), name)
        after = getattr(getattr(asked, section), name)
        if before != after:
            raise ConfigError(
                f"config: {key}={after} cannot apply to {run.root}, whose checkpoints were "
                f"trained with {key}={before}: drop the override, or start a new run with --out"
            )
    critic = saved.algo.trains_critic()
    if not sft and critic != asked.algo.trains_critic():
        a = asked.algo
        if a.estimator != saved.algo.estimator:
            change = f"algo.estimator={a.estimator}"
        else:  # the user's estimator, with or without algo.critic
            change = f"algo.critic={'null' if a.critic is None else str(a.critic).lower()}"
        held, fix = (
            ("hold a", "an estimator with a critic: gae, bi_level_gae, or algo.critic=true")
            if critic
            else ("hold no", "one without: grpo, rloo, reinforce_pp, or algo.critic=false")
        )
        raise ConfigError(
            f"config: {change} cannot apply to {run.root}, whose checkpoints {held} critic "
            f"(algo.estimator={saved.algo.estimator}): use {fix}; or start a new run with --out"
        )
    done = checkpoint.complete_checkpoints(run)
    loop = checkpoint.written_by(done[-1]) if done else None
    if loop is not None and loop != ("sft" if sft else "train"):
        raise ConfigError(
            f"config: {run.root} was written by `ragen {loop}`: continue it with `ragen {loop} "
            f"--resume {run.root}`, or start a new run from one of its checkpoints with "
            f"model.spec={done[-1]}"
        )
    steps_done = int(done[-1].name.removeprefix("step_")) if done else 0
    key = "sft.steps" if sft else "trainer.steps"
    steps = asked.sft.steps if sft else asked.trainer.steps
    if steps < steps_done:
        raise ConfigError(
            f"config: {key}={steps} is fewer than the {steps_done} steps "
            f"{run.root} has done: set {key}={steps_done} or more, or drop the override"
        )


def _check_visible(path) -> None:
    """Every rank loads the checkpoint rank 0 wrote: refuse, on every rank, if one cannot."""
    distributed.check_everywhere(
        None
        if path.is_dir()
        else f"checkpoint {path} is not visible on this machine: put the run directory on a "
        "filesystem every machine mounts at the same path (--out)"
    )


def truncate_after(run: RunDir, step: int) -> None:
    """Forget steps >= ``step`` that a killed run logged past its last checkpoint, so the
    resumed run writes them once."""
    for path in (run.metrics, run.evals, run.alerts):
        read = read_jsonl(path)
        kept = [r for r in read.records if int(r.get("step", -1)) < step]
        if len(kept) != len(read.records) or read.skipped:
            with run.writing(path):
                rewrite_jsonl(path, kept)
    for episodes in run.trajectories.glob("step_*.jsonl"):
        if int(episodes.stem.removeprefix("step_")) >= step:
            with run.writing(episodes):
                episodes.unlink()
