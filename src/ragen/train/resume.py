"""Reading a run directory back to continue it: whether new settings can apply to its
checkpoints, which checkpoint to load, and forgetting what was logged after it.

An exact resume needs nothing more: every source of randomness of step ``s`` derives from
``(trainer.seed, s)``, and the checkpoint holds the weights, the optimiser states and the
run's counters (state.py), so the resumed run replays what the uninterrupted one did.
"""

from __future__ import annotations

from pathlib import Path

from ragen.config import Config, ConfigError
from ragen.run.jsonl import RunDirError, read_jsonl, rewrite_jsonl
from ragen.run.rundir import RunDir
from ragen.train import checkpoint, distributed
from ragen.train.distributed import say
from ragen.train.setup import Models

# Settings the checkpoints' tensors were shaped by: a resume cannot change them.
SHAPING_KEYS = ("model.spec", "model.lora_rank", "model.critic_body", "model.critic_layers")
LORA_KEYS = ("model.lora_alpha", "model.lora_targets")  # shaping too, when LoRA is on
# The game a run's checkpoints were trained on: its steps, logs and report are all of one
# game, so another is a new run (model.spec= a checkpoint), not a resume.
RUN_KEYS = ("env.name",)


def check_resume(run: RunDir, saved: Config, asked: Config, *, sft: bool = False) -> None:
    """Refuse a resume of ``run`` (trained with ``saved``) with settings its checkpoints
    cannot take (``asked``): another game, another model or LoRA, a warm start turned on or
    off, a critic added or dropped (RL runs), fewer steps than are done (``sft.steps`` for a
    `ragen sft` run). Reads only; raises ConfigError with one line naming the key and the
    fix."""
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
    if saved.sft.warm_start != asked.sft.warm_start:
        raise ConfigError(
            f"config: a resume cannot turn sft.warm_start {'off' if saved.sft.warm_start else 'on'}"
            f" ({run.root} runs with sft.warm_start={str(saved.sft.warm_start).lower()}): drop "
            "the override, or start a new run with --out"
        )
    if not sft:
        _check_critic(run, saved, asked)
    done = checkpoint.complete_checkpoints(run)
    loop = checkpoint.written_by(done[-1]) if done else None
    if loop is not None and loop != ("sft" if sft else "train"):
        raise ConfigError(
            f"config: {run.root} was written by `ragen {loop}`: continue it with `ragen {loop} "
            f"--resume {run.root}`, or start a new run from one of its checkpoints with "
            f"model.spec={done[-1]}"
        )
    steps_done = checkpoint.steps_done(done[-1]) if done else 0
    key = "sft.steps" if sft else "trainer.steps"
    steps = asked.sft.steps if sft else asked.trainer.steps
    if steps < steps_done:
        raise ConfigError(
            f"config: {key}={steps} is fewer than the {steps_done} steps "
            f"{run.root} has done: set {key}={steps_done} or more, or drop the override"
        )


def _check_critic(run: RunDir, saved: Config, asked: Config) -> None:
    """Refuse an estimator that adds or drops the critic an RL run's checkpoints hold."""
    critic = saved.algo.trains_critic()
    if critic == asked.algo.trains_critic():
        return
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


def resume(run: RunDir, m: Models) -> tuple[int, dict]:
    """Load the newest checkpoint of ``run`` that loads into ``m`` (rank 0 lists them, every
    rank loads), saying which damaged ones it passed over; drop what the run logged after
    it (everything, when it has no checkpoint yet) so that each step is logged once.

    Returns the step to continue from and the checkpoint's trainer state ({} without one).
    Raises RunDirError when the run has checkpoints and none of them loads.
    """
    folders = distributed.broadcast(checkpoint.checkpoint_folders(run))
    step = 0
    state: dict = {}
    skipped: list[str] = []
    for path in reversed(folders):
        problem = distributed.broadcast(checkpoint.damage(path))
        if problem is None:
            check_visible(path)
            problem, state = _load(path, m)
        if problem is None:
            step = checkpoint.steps_done(path)
            if skipped:
                say(f"resuming from {path.name}; skipped {'; '.join(skipped)}")
            break
        skipped.append(f"{path.name}: {problem}")
    else:
        if folders:
            raise RunDirError(
                f"no checkpoint of {run.root} is intact ({'; '.join(skipped)}): "
                "nothing to resume from; start a new run with --out"
            )
        say(f"{run.root} has no checkpoint yet: starting again from step 0")
    if distributed.is_main():
        checkpoint.sweep(run)
        truncate_after(run, step)
    return step, state


def _load(path: Path, m: Models) -> tuple[str | None, dict]:
    """Load the checkpoint at ``path`` into the models: (None, its trainer state), or what
    went wrong if it does not load (the same answer on every rank) and {}."""
    problem: str | None
    state: dict = {}
    try:
        state = checkpoint.load_checkpoint(
            path, policy=m.policy, critic=m.critic, optimizers=m.optimizers
        )
    except checkpoint.LOAD_ERRORS as err:
        lines = str(err).strip().splitlines()
        problem = f"does not load ({type(err).__name__}: {lines[0] if lines else ''})"
    else:
        problem = None
    problems = [p for p in distributed.gather(problem) if p is not None]
    return (problems[0], {}) if problems else (None, state)


def check_visible(path: Path) -> None:
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
