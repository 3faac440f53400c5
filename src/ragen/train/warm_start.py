"""A warm start: `ragen train` with ``sft.warm_start`` runs a `ragen sft` stage first, then RL
from its last checkpoint, under one command and one budget.

The stage is a run directory of its own inside the RL run's, ``RUN/warm_start`` (everything
`ragen sft --out` writes). Once its last checkpoint is saved, ``stage.json`` records it: the
checkpoint RL starts from, the stage's steps and wall minutes, and the RL stage's budget.
That record is what says the stage has ended; RUN/config.yaml is then rewritten as the RL
stage's config (``stage.rl_config``), so from there on RUN is an RL run like any other: its
config reproduces the RL stage, and `ragen train --resume RUN` resumes RL without redoing the
warm start. Before the record, `ragen train --resume RUN` continues the stage from its last
checkpoint (the exact resume of `ragen sft`), then runs RL.

The budget: the stage runs under ``sft.warm_start_minutes`` (0: under trainer.max_minutes,
the whole budget, as a cap), by trainer.max_minutes' rule; RL gets trainer.max_minutes less
the stage's wall minutes (model load and evaluations included), and at least one step. As a
resumed run gets its budget afresh, a resumed stage counts its minutes from the resume.

A study's warm start (ragen.study.spec.WarmStart) differs: one `ragen sft` per seed that all
the runs of that seed start from, each run a process of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from ragen.config import Config, load_run, validate
from ragen.run.jsonl import write_atomic
from ragen.run.rundir import RunDir, create_run_dir, read_stage_record, rewrite_config
from ragen.train import distributed
from ragen.train.checkpoint import complete_checkpoints, steps_done
from ragen.train.preflight import check_expert, check_references
from ragen.train.resume import check_resume

MIN_RL_MINUTES = 0.001
"""The RL stage's budget when the warm start spent the whole of trainer.max_minutes: a run
always trains one step (the budget is judged after each step), so RL runs exactly one."""


def stage_config(c: Config) -> Config:
    """The config of ``c``'s warm start, a plain `ragen sft` run: ``c`` with
    trainer.max_minutes set to the stage's budget and sft.warm_start off."""
    minutes = c.sft.warm_start_minutes or c.trainer.max_minutes
    return validate(
        replace(
            c,
            trainer=replace(c.trainer, max_minutes=minutes),
            sft=replace(c.sft, warm_start=False),
        )
    )


def rl_minutes(budget: float, spent: float) -> float:
    """trainer.max_minutes of the RL stage: what ``spent`` minutes of warm start left of
    ``budget``, rounded to 0.001 minute and at least MIN_RL_MINUTES; 0 (no budget) stays 0."""
    if budget == 0:
        return 0.0
    return max(round(budget - spent, 3), MIN_RL_MINUTES)


def rl_config(c: Config, record: dict) -> Config:
    """The config of the RL stage after the warm start ``record`` (stage.json): ``c``
    starting from the stage's last checkpoint, with the budget it left, sft.warm_start off
    (the warm start is in model.spec now)."""
    return validate(
        replace(
            c,
            model=replace(c.model, spec=record["checkpoint"]),
            trainer=replace(c.trainer, max_minutes=float(record["rl_max_minutes"])),
            sft=replace(c.sft, warm_start=False),
        )
    )


def finish(stage: RunDir, c: Config, minutes: float) -> dict:
    """Record ``stage`` (the warm start of a run of ``c``, which took ``minutes``) as ended:
    write its stage.json, naming its last checkpoint by absolute path (the RL run's
    model.spec, whatever the working directory of a later resume), and return it."""
    last = complete_checkpoints(stage)[-1]  # a run always saves its last step
    record = {
        "checkpoint": str(last.resolve()),
        "steps": steps_done(last),
        "minutes": round(minutes, 3),
        "rl_max_minutes": rl_minutes(c.trainer.max_minutes, minutes),
    }
    with stage.writing(stage.stage_record):
        write_atomic(stage.stage_record, json.dumps(record, indent=1) + "\n")
    return record


# ------------------------------------------------------------------ the stages of one run


def check_can_start(c: Config) -> None:
    """Refuse, before anything is written, a warm start that cannot run: an env without an
    expert (the user's imported here), or several processes (`ragen sft` runs in one)."""
    check_expert(c, "config: sft.warm_start=true but ", ": set sft.warm_start=false")
    if distributed.world_size() > 1:
        raise distributed.LaunchError(
            "sft.warm_start runs `ragen sft`, which runs in one process: run `ragen sft` "
            "first, then `ragen train ... sft.warm_start=false model.spec=ITS_CHECKPOINT` "
            "under torchrun"
        )


@dataclass(frozen=True)
class Stage:
    """The warm start left to run: its run directory, its `ragen sft` config, and whether
    it continues from its checkpoint."""

    run: RunDir
    config: Config
    resume: bool


def open_stage(c: Config, run: RunDir, *, resume: bool) -> Stage | None:
    """With ``run``'s lock held: make ``run`` (a new one) with ``c``, then say what is left
    of its warm start: None once stage.json records it as ended; else the stage, to start
    or, if its folder has a config, to resume (refused, in one line, with settings its
    checkpoints cannot take)."""
    if not resume:
        create_run_dir(run.root, c)
    stage = run.warm_start
    if read_stage_record(stage) is not None:
        return None
    sft = stage_config(c)
    again = stage.config.is_file()
    if again:
        check_resume(stage, check_references(load_run(stage.config)), sft, sft=True)
    return Stage(stage, sft, again)


def opening_line(c: Config, stage: Stage) -> str:
    """What the warm-started run ``c`` does from here, said as its ``stage`` starts or
    resumes: the stage ends at its budget or its sft.steps, whichever comes first, and RL
    follows for trainer.steps (within what is left of trainer.max_minutes, if set)."""
    sft = stage.config
    minutes = sft.trainer.max_minutes
    ends = f"{sft.sft.steps} steps"
    if minutes:
        ends = f"{minutes:g} min or {ends}, whichever comes first"
    rl = f"{c.trainer.steps} RL steps" + (
        f" within trainer.max_minutes={c.trainer.max_minutes:g}" if c.trainer.max_minutes else ""
    )
    verb = "resumes" if stage.resume else "starts"
    return (
        f"warm start: `ragen sft` {verb} in {stage.run.root} (until {ends}), then {rl} from "
        "its last checkpoint"
    )


def start_rl(c: Config, run: RunDir, minutes: float) -> Config:
    """With ``run``'s lock held and its warm start ended (``minutes`` long, if stage.json
    does not say already): record the stage, make run/config.yaml the RL stage's, say so,
    and return that config."""
    stage = run.warm_start
    record = read_stage_record(stage) or finish(stage, c, minutes)
    rl = check_references(rl_config(c, record))
    rewrite_config(run, rl)
    left = rl.trainer.max_minutes
    distributed.say(
        f"warm start: {record['steps']} steps of ragen sft in {record['minutes']:.1f} min; RL "
        f"starts from {record['checkpoint']}"
        + (f" with trainer.max_minutes={left:g} left" if left else "")
    )
    return rl
