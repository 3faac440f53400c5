"""Evaluate a policy on fixed seeds and write the results into a run directory."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ragen.config import Config, TrainerConfig
from ragen.monitor.jsonl import RunDirError, append_jsonl
from ragen.monitor.rundir import RunDir
from ragen.rollout.evaluate import eval_seeds, summarize
from ragen.rollout.generator import Generator
from ragen.rollout.loop import EVAL_SEED_BASE, RolloutSpec, rollout
from ragen.rollout.trajectory import Trajectory
from ragen.sysmem import trim_heap
from ragen.train import distributed

_TRAINER = TrainerConfig()  # the evaluation defaults, defined there


@dataclass(frozen=True)
class EvalRequest:
    """What to evaluate: ``n`` fixed seeds of ``env``, ``k`` tries each, at ``temperature``."""

    env: str
    n: int = _TRAINER.eval_episodes
    k: int = 1
    temperature: float = _TRAINER.eval_temperature


def evaluate(
    generator: Generator, tokenizer, config: Config, request: EvalRequest, *, progress: bool
) -> tuple[dict, list[Trajectory]]:
    """Roll out the evaluation and summarise it; the same request gives the same seeds.
    Under torchrun each rank plays its share of the seeds and every rank gets the summary
    of them all (the same as one process would)."""
    spec = RolloutSpec.from_config(config.rollout, temperature=request.temperature)
    options = config.env.options if request.env == config.env.name else {}
    bar = tqdm(total=spec.max_turns, desc=f"eval {request.env}", unit="turn", disable=not progress)

    def on_turn(turn: int, live: int) -> None:
        bar.set_postfix(live=live)
        bar.update(1 if turn else 0)

    started = time.perf_counter()
    seeds = eval_seeds(request.n, EVAL_SEED_BASE)
    mine = distributed.shard(len(seeds))
    try:
        played = rollout(
            generator,
            tokenizer,
            request.env,
            seeds[mine.start : mine.stop],
            request.k,
            spec,
            env_options=options,
            sample_seed=config.trainer.seed,
            first_group=mine.start,
            on_turn=on_turn,
        )
        trajectories = distributed.gather_list(played)
    finally:
        bar.update(bar.total - bar.n)
        bar.close()
        trim_heap()  # the episodes' KV caches, freed: see ragen.sysmem
    summary = summarize(trajectories)
    summary.update(env=request.env, temperature=request.temperature)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    return summary, trajectories


def eval_files(out: Path) -> tuple[Path, Path]:
    """(summary file, episode file) of a standalone evaluation in ``out``."""
    run = RunDir(out)
    return run.evals, run.trajectories / "eval.jsonl"


def check_eval_out(out: Path) -> None:
    """Refuse an output folder that already holds an evaluation's episodes."""
    _, episodes = eval_files(out)
    if episodes.exists():
        raise RunDirError(f"{episodes} already exists: choose another --out")


def write_eval(out: Path, summary: dict, trajectories: list[Trajectory], model: str) -> None:
    """Append the summary to eval.jsonl and write every episode to trajectories/eval.jsonl."""
    summaries, episodes = eval_files(out)
    append_jsonl(episodes, [t.to_record() for t in trajectories])
    append_jsonl(summaries, [{"model": model, **summary}])
