"""The run loop: steps of a trainer in a run directory, with what every run does around them.

One iteration: the trainer's step (StarPO's rollout → update in trainer.py, or a supervised
step in sft.py), then the budget check, the template probe, the evaluation, the metrics and
episodes written, the collapse monitor and its action (stop, or roll back), the checkpoint.

Building a loop writes nothing; ``resume`` continues a run from its checkpoint, ``train``
runs the steps left. Under torchrun every process runs the loop on its share of the groups
(see distributed.py); rank 0 logs, writes the run directory and checkpoints, and decides when
to stop. With ``trainer.parallel=fsdp`` every pass without gradients runs inside
``fsdp.full_weights``.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Protocol

import torch
from tqdm import tqdm

from ragen.config import Config, MonitorConfig, to_dict
from ragen.host import threads
from ragen.monitor.collapse import Alert, CollapseDetector
from ragen.monitor.template import sample_pairs, template_collapse_metrics
from ragen.rollout.engines import Generator
from ragen.rollout.trajectory import Trajectory
from ragen.run.jsonl import append_jsonl
from ragen.run.metrics_logger import MetricsLogger
from ragen.run.rundir import BEFORE_TRAINING, RunDir
from ragen.train import checkpoint, distributed, fsdp
from ragen.train.distributed import say
from ragen.train.eval_cache import (
    REUSED_FROM,
    EvalCache,
    eval_key,
    policy_digests,
    sampling_machine,
)
from ragen.train.evaluator import HEADLINE, EvalRequest, evaluate
from ragen.train.generation_weights import COPYING_BACKENDS, GenerationWeights
from ragen.train.resume import check_visible, resume
from ragen.train.schedule import set_learning_rates
from ragen.train.setup import Models, autocast
from ragen.train.state import RunState


class Step(Protocol):
    """What the loop drives: the StarPO step (trainer.Trainer) or the supervised one
    (sft.SftTrainer), with the models it trains and what the rollout samples with."""

    name: str  # the command that runs it: the progress bar's label, the checkpoints' writer
    watched: bool  # whether the collapse monitor (monitor.enabled) watches its metrics
    config: Config
    device: torch.device
    m: Models
    sampler: GenerationWeights
    generator: Generator
    update_dtype: torch.dtype | None

    @property
    def steps(self) -> int:
        """Steps of the whole run."""
        ...

    def step(self, step: int, state: RunState) -> tuple[dict[str, float], list[Trajectory]]:
        """Train one step: its metrics, and the episodes it played (trajectories/)."""
        ...

    def evaluates(self, step: int, last: bool) -> bool:
        """Whether ``step`` (``last``: the run's final one) ends with an evaluation."""
        ...

    def progress(self, metrics: dict[str, float]) -> dict[str, str]:
        """What the progress bar shows of a step's metrics."""
        ...


def out_of_budget(elapsed: float, steps_done: int, budget: float) -> bool:
    """Whether one more step, at the mean pace of the ``steps_done`` steps that took
    ``elapsed`` seconds, would end past ``budget`` seconds."""
    return elapsed + elapsed / max(1, steps_done) > budget


def stop_reason(mon: MonitorConfig, rollbacks: int, target: Path | None) -> str | None:
    """Why an actionable alert under monitor.action=stop or rollback ends the run; None when
    it rolls back to ``target`` (the checkpoint with the best eval success) instead."""
    if mon.action == "stop":
        return "monitor.action=stop"
    if target is None:
        return "no evaluated checkpoint to roll back to"
    if rollbacks >= mon.max_rollbacks:
        return f"monitor.max_rollbacks={mon.max_rollbacks} used"
    return None


class RunLoop:
    """Owns the run directory, the step counter and the run's state; drives ``trainer``."""

    def __init__(self, trainer: Step, run: RunDir) -> None:
        self.trainer, self.run = trainer, run
        self.config = trainer.config
        watch = self.config.monitor.enabled and trainer.watched
        self.detector = CollapseDetector(self.config.monitor) if watch else None
        self.state = RunState()
        self.start_step = 0
        self.started = time.monotonic()  # max_minutes counts from here; train() restarts it

    @property
    def steps(self) -> int:
        """Steps of the whole run."""
        return self.trainer.steps

    def resume(self) -> int:
        """Continue the run from its newest checkpoint that loads (``resume.resume``): the
        weights, optimiser states and counters back, the logs past it dropped. Returns the
        step ``train`` starts from."""
        self.start_step, saved = resume(self.run, self.trainer.m)
        self.state.restore(saved)
        if self.detector is not None and "monitor" in saved:
            self.detector.load_state_dict(saved["monitor"])
        return self.start_step

    # ------------------------------------------------------------------------ the loop

    def train(self) -> None:
        """Run the steps from ``start_step`` to the last (or to a stop)."""
        main = distributed.is_main()
        if self.config.trainer.eval_before and self.start_step == 0:
            # Not the rollback target's figure (eval_success): no checkpoint holds this policy.
            self.evaluate_policy(BEFORE_TRAINING)
        # The budget is the training's: the evaluation before it does not count against it,
        # the training time of a resumed run's earlier launches does.
        self.started = time.monotonic() - self.state.seconds
        with (
            self._logger() if main else nullcontext() as log,  # rank 0 writes the run directory
            tqdm(
                total=self.steps,
                initial=self.start_step,
                desc=self.trainer.name,
                unit="step",
                disable=not (self.config.logging.progress and main),
            ) as bar,
            self.thread_follower() as follow,
        ):
            for step in range(self.start_step, self.steps):
                follow()
                bar.set_postfix(self.trainer.progress(self.run_step(step, log)))
                bar.update(1)
                if self.state.stopped_at is not None:
                    break

    def run_step(self, step: int, log: MetricsLogger | None) -> dict[str, float]:
        """One step of the trainer and what follows it; returns the metrics it logged
        (``log`` is None off rank 0)."""
        metrics, episodes = self.trainer.step(step, self.state)
        self.state.eval_success = None  # the weights moved: not evaluated until they are
        last = self.is_last(step)  # decided once: the budget may pass during the evaluation
        if self.trainer.watched:
            metrics.update(self.maybe_measure_templates(step, episodes))
        metrics.update(self.maybe_evaluate(step, last))
        self.watch(step, metrics, last)
        metrics.update(self.evaluate_stopped(step, last))
        self.record(step, log, metrics, episodes)
        self.maybe_checkpoint(step, last)
        return metrics

    def evaluate_stopped(self, step: int, last: bool) -> dict[str, float]:
        """The evaluation of a run the monitor stopped at ``step`` (not its ``last``, which
        evaluates anyway) where this step did not evaluate: the run ends measured, as one that
        ran its course does. Its figures join the step's metrics, which the detector judged
        without them."""
        stopped = self.state.stopped_at == step and not last
        if not stopped or self.trainer.evaluates(step, last):
            return {}
        return self.maybe_evaluate(step, last=True)

    def thread_follower(self) -> threads.Follower:
        """What sets torch's threads before each step (``threads.Follower``); a backend
        that samples with this process's model keeps the whole run in this process."""
        whole_run = self.config.rollout.backend in COPYING_BACKENDS
        return threads.Follower(self.config.trainer.threads, say=say, whole_run=whole_run)

    def is_last(self, step: int) -> bool:
        """The run's final step: the configured count, a stop, or the wall-clock budget."""
        t = self.config.trainer
        out_of_time = t.max_minutes > 0 and out_of_budget(
            time.monotonic() - self.started, step + 1, 60 * t.max_minutes
        )
        out_of_time = distributed.broadcast(out_of_time)  # rank 0's clock: every rank agrees
        if out_of_time and self.state.stopped_at is None:
            say(f"[step {step}] trainer.max_minutes={t.max_minutes:g} reached: last step")
            self.state.stop(step, f"trainer.max_minutes={t.max_minutes:g}")
        return step + 1 == self.steps or self.state.stopped_at == step

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

    # ------------------------------------------------------------------------ evaluation

    def maybe_evaluate(self, step: int, last: bool = False) -> dict[str, float]:
        """Evaluate on fixed seeds at the eval temperature when the trainer ``evaluates``."""
        if not self.trainer.evaluates(step, last):
            return {}
        metrics = self.evaluate_policy(step)
        successes = [v for k, v in metrics.items() if k.endswith("/success")]
        self.state.eval_success = sum(successes) / len(successes)
        return metrics

    def evaluate_policy(self, step: int) -> dict[str, float]:
        """Evaluate the policy as it is after ``step`` (BEFORE_TRAINING: as it starts) on
        every eval env; each summary goes to eval.jsonl, and its headline figures are
        returned as ``eval/<env>/<figure>`` metrics."""
        t, trainer = self.config.trainer, self.trainer
        metrics = {}
        trainer.sampler.refresh()
        # the starting policy's digests, read once for every env, where a cache may hold it
        cacheable = (
            step == BEFORE_TRAINING and t.eval_before_cache and distributed.world_size() == 1
        )
        policy = policy_digests(trainer.m.policy, trainer.m.tokenizer) if cacheable else None
        for env in self.config.env.eval_names or [self.config.env.name]:
            request = EvalRequest.of(t, env)
            summary = self.summarize(request, policy)
            if distributed.is_main():
                with self.run.writing(self.run.evals):
                    append_jsonl(self.run.evals, [{"step": step, **summary}])
            for key in HEADLINE:
                metrics[f"eval/{env}/{key}"] = summary[key]
            when = "before training" if step == BEFORE_TRAINING else f"step {step}"
            reused = f", kept by {summary[REUSED_FROM]}" if REUSED_FROM in summary else ""
            say(
                f"[{when}] eval {env}: success {summary['success']:.1%}, format-ok "
                f"{summary['format_ok']:.1%} ({request.n} seeds, T={request.temperature:g}"
                f"{reused})"
            )
        return metrics

    def summarize(self, request: EvalRequest, policy: dict[str, str] | None) -> dict:
        """The summary of ``request``: played, or, given the starting ``policy``'s digests
        (`policy_digests`), read from ``trainer.eval_before_cache`` where a run kept it (and
        kept there for the next run when not)."""
        folder = self.config.trainer.eval_before_cache
        if policy is not None:
            machine = sampling_machine(self.trainer.sampler.model)
            cache, key = EvalCache(Path(folder)), eval_key(self.config, request, policy, machine)
            if (kept := cache.get(key)) is not None:
                return kept
        trainer = self.trainer
        with fsdp.full_weights(trainer.m.policy):  # the seeds are shared unevenly
            summary, _ = evaluate(
                trainer.generator, trainer.m.tokenizer, self.config, request, progress=False
            )
        if policy is not None and (failed := cache.put(key, summary, self.run.root)) is not None:
            say(f"eval {request.env}: not kept in {folder} ({failed}); later runs play it again")
        return summary

    # ------------------------------------------------------------------------ the monitor

    def maybe_measure_templates(self, step: int, trajectories: list[Trajectory]) -> dict:
        """Every ``monitor.template_every`` steps: template collapse (RAGEN-2), the policy
        cross-scoring a sample of reasonings under each other's prompts. On rank 0, which
        logs and monitors."""
        mon, m = self.config.monitor, self.trainer.m
        if not mon.enabled or mon.template_every == 0 or (step + 1) % mon.template_every:
            return {}
        # every rank takes part in gathering the weights, then rank 0 alone runs the passes
        with fsdp.full_weights(m.policy):
            if not distributed.is_main():
                return {}
            pairs = sample_pairs(
                trajectories,
                m.tokenizer.decode,
                max_pairs=mon.template_pairs,
                seed=self.config.trainer.seed + step,
            )
            with autocast(self.trainer.device, self.trainer.update_dtype):
                return template_collapse_metrics(
                    m.policy, pairs, temperature=self.config.rollout.temperature or 1.0
                )

    def watch(self, step: int, metrics: dict[str, float], last: bool = False) -> list[Alert]:
        """Feed the step's metrics to the collapse detector; report alerts and act on them
        (``last``: the run's final step, after which no rollback has anything to continue).
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
            self.act(step, last)
        return alerts

    def act(self, step: int, last: bool = False) -> None:
        """monitor.action on an actionable alert: nothing, stop, or roll back to the
        checkpoint with the best eval success and continue with the configured changes; on
        the run's ``last`` step nothing follows, so the alert is only logged."""
        mon = self.config.monitor
        if mon.action == "warn":
            return
        if last:
            say(f"[step {step}] the run's last step: no {mon.action}, nothing follows it")
            return
        target = distributed.broadcast(checkpoint.best_checkpoint(self.run))  # rank 0's choice
        why = stop_reason(mon, self.state.rollbacks, target)
        if why is not None:
            say(f"[step {step}] stopping the run ({why}); last checkpoint: step_{step + 1}")
            self.state.stop(step, why)
            return
        assert target is not None  # stop_reason gives a reason when there is none
        self.roll_back(step, target)

    def roll_back(self, step: int, target: Path) -> None:
        """Load the checkpoint at ``target`` and count the rollback: the learning rates from
        the next step on are cut by monitor.rollback_lr_scale once more, and the filter
        keeps monitor.rollback_filter_ratio of the groups if one is set."""
        m, mon = self.trainer.m, self.config.monitor
        check_visible(target)
        checkpoint.load_checkpoint(
            target, policy=m.policy, critic=m.critic, optimizers=m.optimizers
        )
        self.state.rollbacks += 1
        self.state.eval_success = None  # the target's weights: its checkpoint holds its figure
        done = self.state.rollbacks
        set_learning_rates(m.optimizers, self.config, step + 1, done)
        say(
            f"[step {step}] rolled back to {target.name} (rollback {done} of "
            f"{mon.max_rollbacks}); learning rates x{mon.rollback_lr_scale**done:g}"
        )

    # ------------------------------------------------------------------------ the run directory

    def maybe_checkpoint(self, step: int, last: bool = False) -> None:
        """Save every ``trainer.save_every`` steps, on the last step, and when a monitor
        action stopped the run at this step."""
        t, m = self.config.trainer, self.trainer.m
        last = last or self.state.stopped_at == step
        # Every rank calls save_checkpoint: with sharded models each holds a part of the
        # weights and optimiser states, gathered onto rank 0, which writes.
        if last or (t.save_every and (step + 1) % t.save_every == 0):
            self.state.seconds = time.monotonic() - self.started
            state = {"loop": self.trainer.name, **self.state.saved()}
            if self.detector is not None:
                state["monitor"] = self.detector.state_dict()
            checkpoint.save_checkpoint(
                self.run,
                step + 1,
                policy=m.policy,
                tokenizer=m.tokenizer,
                critic=m.critic,
                optimizers=m.optimizers,
                state=state,
                keep=t.keep_checkpoints,
            )

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
