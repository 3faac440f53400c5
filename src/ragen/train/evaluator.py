"""Evaluation on fixed seeds: play them, summarise them (success, pass@k, turns, format, why
episodes ended) and write the results into a run directory."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm import tqdm

from ragen import phases
from ragen.config import Config, TrainerConfig, env_options, to_yaml
from ragen.config.schema import EvalSplit
from ragen.host.memory import trim_heap
from ragen.monitor.metrics import action_template
from ragen.rollout.engines import CachedGenerator, Generator
from ragen.rollout.engines.memory import kept_cache_episodes
from ragen.rollout.loop import SPLIT_SEED_BASES, RolloutSpec, rollout
from ragen.rollout.trajectory import END_REASONS, Trajectory
from ragen.run.jsonl import append_jsonl, rewrite_jsonl, write_atomic
from ragen.run.rundir import SEED_SUCCESSES, RunDir, eval_files
from ragen.train import distributed

_TRAINER = TrainerConfig()  # the evaluation defaults, defined there


def eval_seeds(n: int, split: str = _TRAINER.eval_split) -> list[int]:
    """The fixed seeds of an evaluation of ``n`` levels of ``split`` (config.EVAL_SPLITS):
    the same for every model and run."""
    base = SPLIT_SEED_BASES[split]
    return list(range(base, base + n))


def summarize(trajectories: Sequence[Trajectory]) -> dict:
    """Summary numbers of an evaluation; groups are seeds, copies are the k tries of pass@k.

    ``success`` is the mean over all episodes; ``pass_at_k`` the share of seeds where at
    least one of the k copies succeeded (k = copies per seed); ``seed_successes`` how many
    copies of each seed succeeded, in seed order, so that two evaluations of the same seeds
    can be compared level by level (ragen.report.paired).
    """
    if not trajectories:
        raise ValueError("nothing to summarize: no trajectories")
    by_group: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        by_group.setdefault(t.group, []).append(t)
    n = len(trajectories)
    turns = [turn for t in trajectories for turn in t.turns]
    ends = Counter(t.end for t in trajectories)
    template, share = action_template(
        ([a for turn in t.turns for a in turn.actions], t.success) for t in trajectories
    )
    return {
        "episodes": n,
        "seeds": len(by_group),
        "k": max(len(g) for g in by_group.values()),
        "success": sum(t.success for t in trajectories) / n,
        "pass_at_k": sum(any(t.success for t in g) for g in by_group.values()) / len(by_group),
        "reward_mean": sum(t.total_reward for t in trajectories) / n,
        "turns_mean": len(turns) / n,
        "actions_mean": sum(len(turn.actions) for turn in turns) / n,
        "format_ok": sum(turn.format_ok for turn in turns) / max(1, len(turns)),
        "reply_tokens_mean": sum(turn.reply_tokens for turn in turns) / max(1, len(turns)),
        "end": {reason: ends.get(reason, 0) / n for reason in END_REASONS},
        "action_template": list(template),
        "action_template_share": share,
        SEED_SUCCESSES: [int(sum(t.success for t in by_group[g])) for g in sorted(by_group)],
    }


def format_summary(env: str, summary: dict) -> str:
    """A few human lines for the console."""
    ends = ", ".join(f"{k} {v:.0%}" for k, v in summary["end"].items() if v)
    split = summary.get("split", "dev")  # summaries written before the splits played dev
    return (
        f"{env}: success {summary['success']:.2%}  pass@{summary['k']} "
        f"{summary['pass_at_k']:.2%}  reward {summary['reward_mean']:+.3f}  "
        f"({summary['episodes']} episodes, {summary['seeds']} {split} seeds)\n"
        f"  turns {summary['turns_mean']:.2f}  actions {summary['actions_mean']:.2f}  "
        f"format-ok {summary['format_ok']:.2%}  reply tokens {summary['reply_tokens_mean']:.1f}  "
        f"one action sequence {summary['action_template_share']:.1%}\n"
        f"  ended: {ends}"
        + (_format_cost(summary["cost"]) if "cost" in summary else "")
        + (_format_api(summary["api"]) if "api" in summary else "")
    )


def _format_api(api: dict) -> str:
    return (
        f"\n  api: {api['requests']:,} requests ({api['retries']:,} retried), "
        f"{api['prompt_tokens']:,} prompt + {api['completion_tokens']:,} completion tokens; "
        "no reply prefix (the server writes the whole reply)"
    )


def _format_cost(cost: dict) -> str:
    def rate(tokens: int, seconds: float) -> str:
        return f"{tokens / seconds:,.0f} tok/s" if seconds > 0 else "—"

    return (
        f"\n  time: prefill {cost['prefill_s']:.0f} s ({cost['prefilled_tokens']:,} tokens, "
        f"{rate(cost['prefilled_tokens'], cost['prefill_s'])}), decode {cost['decode_s']:.0f} s "
        f"({cost['generated_tokens']:,} tokens, "
        f"{rate(cost['generated_tokens'], cost['decode_s'])}), env {cost['env_s']:.0f} s"
    ) + _format_cuts(cost.get("memory_cuts", 0))


def _format_cuts(cuts: int) -> str:
    """The line that marks an evaluation whose batches free memory cut (none where none was;
    summaries written before the count have none)."""
    if not cuts:
        return ""
    return (
        f"\n  memory: free memory cut {cuts} decode batch(es) or wave(s) below the plan, so "
        "these figures can differ slightly from a run with more memory free"
    )


HEADLINE = (
    "success",
    "pass_at_k",
    "reward_mean",
    "format_ok",
    "turns_mean",
    "action_template_share",
)
"""The figures of a summary a trainer's evaluation logs as ``eval/<env>/<figure>`` metrics."""


@dataclass(frozen=True)
class EvalRequest:
    """What to evaluate: ``n`` fixed seeds of ``env`` from ``split``, ``k`` tries each, at
    ``temperature``."""

    env: str
    n: int = _TRAINER.eval_episodes
    k: int = _TRAINER.eval_k
    temperature: float = _TRAINER.eval_temperature
    split: EvalSplit = _TRAINER.eval_split

    @classmethod
    def of(cls, trainer: TrainerConfig, env: str) -> EvalRequest:
        """The evaluation of ``env`` a config's ``trainer.eval_*`` settings ask for."""
        t = trainer
        return cls(env, t.eval_episodes, t.eval_k, t.eval_temperature, t.eval_split)

    def in_config(self, config: Config) -> Config:
        """``config`` with this request as its ``trainer.eval_*`` settings (the inverse of
        :meth:`of`): what an evaluation folder records it played by."""
        trainer = replace(
            config.trainer,
            eval_episodes=self.n,
            eval_k=self.k,
            eval_temperature=self.temperature,
            eval_split=self.split,
        )
        return replace(config, trainer=trainer)


def eval_spec(config: Config, request: EvalRequest) -> RolloutSpec:
    """The rollout settings an evaluation plays by: the config's, at the request's
    temperature."""
    return RolloutSpec.from_config(config.rollout, temperature=request.temperature)


def eval_wave(generator: Generator, spec: RolloutSpec, k: int, seeds: int) -> int:
    """How many of ``seeds`` an evaluation plays at once: all of them, unless the caches its
    generator keeps between turns (``k`` episodes a seed, up to the context limit each) would
    outgrow their share of memory."""
    if not isinstance(generator, CachedGenerator):
        return max(1, seeds)
    fit = kept_cache_episodes(generator.model, spec.max_context_tokens, seeds * k)
    generator.stats.memory_cuts += fit.cut
    return max(1, fit.size // k)


def evaluate(
    generator: Generator, tokenizer, config: Config, request: EvalRequest, *, progress: bool
) -> tuple[dict, list[Trajectory]]:
    """Roll out the evaluation and summarise it; the same request gives the same seeds.
    Under torchrun each rank plays its share of the seeds and every rank gets the summary
    of them all (the same as one process would)."""
    spec = eval_spec(config, request)
    options = env_options(config, request.env)
    bar = tqdm(total=spec.max_turns, desc=f"eval {request.env}", unit="turn", disable=not progress)

    def on_turn(turn: int, live: int) -> None:
        bar.set_postfix(live=live)
        bar.update(1 if turn else 0)

    started = time.perf_counter()
    spent, counts = phases.totals(), asdict(generator.stats)
    seeds = eval_seeds(request.n, request.split)
    mine = distributed.shard(len(seeds))
    wave = eval_wave(generator, spec, request.k, len(mine))
    bar.total = spec.max_turns * max(1, -(-len(mine) // wave))
    try:
        played = []
        for start in range(mine.start, mine.stop, wave):
            # Numbered from its first group, a wave samples what it would in one rollout.
            played += rollout(
                generator,
                tokenizer,
                request.env,
                seeds[start : min(start + wave, mine.stop)],
                request.k,
                spec,
                env_options=options,
                sample_seed=config.trainer.seed,
                first_group=start,
                on_turn=on_turn,
            )
            trim_heap()  # the wave's kept caches, released
        trajectories = distributed.gather_list(played)
    finally:
        bar.update(bar.total - bar.n)
        bar.close()
        trim_heap()  # the episodes' KV caches, freed: see ragen.host.memory
    summary = summarize(trajectories)
    summary.update(env=request.env, temperature=request.temperature, split=request.split)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    summary["cost"] = _cost(spent, counts, phases.totals(), asdict(generator.stats))
    return summary, trajectories


# What an evaluation's summary reports of its cost: phase clocks and generator counters.
_COST_PHASES = {
    "prefill_s": phases.ROLLOUT_PREFILL,
    "decode_s": phases.ROLLOUT_DECODE,
    "env_s": phases.ROLLOUT_ENV,
}
_COST_COUNTS = ("prefilled_tokens", "reused_tokens", "generated_tokens", "memory_cuts")


def _cost(spent: dict, counts: dict, spent_after: dict, counts_after: dict) -> dict:
    """Where this process's share of an evaluation went: the seconds of prefill, decode and
    env work, the tokens prefilled, reused from a cache and generated, and the batches free
    memory cut, as differences of the phase clocks and generator counters taken before and
    after it."""
    cost = {key: round(spent_after[p] - spent[p], 2) for key, p in _COST_PHASES.items()}
    cost.update({key: counts_after[key] - counts[key] for key in _COST_COUNTS})
    return cost


def write_eval(
    out: Path,
    summary: dict,
    trajectories: list[Trajectory],
    model: str,
    config: Config,
    machine: dict | None = None,
) -> None:
    """Write ``config`` (what the evaluation played by) to eval-config.yaml, every episode to
    trajectories/eval.jsonl and append the summary, with ``model`` and where it ran
    (``machine``, a `machine_record`; None over an API), to eval.jsonl, all or none: a failed
    write (a disk filled since `check_eval_out` passed) leaves neither file and eval.jsonl as
    it was, and raises RunDirError saying what to do."""
    summaries, episodes, config_file = eval_files(out)
    with RunDir(out).writing(out, then="run `ragen eval` again"):
        episodes.parent.mkdir(parents=True, exist_ok=True)
        try:
            write_atomic(config_file, to_yaml(config))
            rewrite_jsonl(episodes, [t.to_record() for t in trajectories])  # whole or none
            where = {} if machine is None else {"machine": machine}
            append_jsonl(summaries, [{"model": model, **where, **summary}])
        except BaseException:
            episodes.unlink(missing_ok=True)
            config_file.unlink(missing_ok=True)
            raise
