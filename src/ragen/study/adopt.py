"""Taking a study's finished runs from kept logs (``ragen study NAME --adopt DIR``).

A study folder holds checkpoints of gigabytes, so what outlives a machine is usually a copy
of its runs' logs: ``DIR/RUN/seed-K`` with config.yaml, metrics.jsonl and eval.jsonl (and
any other file of the run folder), perhaps DIR/study.json. Adopting copies each such run
that the study plans, has not done and has no folder for, into ``OUT/RUN/seed-K`` (no
checkpoints) and records it done, so the study runs only the rest.

The kept evaluations before training (``DIR/eval-before``) are copied too, those the study
folder lacks: each is keyed by the weights, settings and machine it was played with, so a
run reads one only where it would have played the same episodes (a warm start made again
on the same kind of machine evaluates to the same summary without playing it).

A run is adopted only when its logs show it finished, and never when its settings are not
the ones the study asks for now (that is refused, as a changed study is). A warm start is
adopted only when every run that starts from it is done or adopted too: its checkpoint,
which logs do not carry, is what those runs start from, so otherwise it is made again (with
the same settings and seed, on the same kind of machine, the same weights; machine.jsonl
says where each ran).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from ragen.config.loading import read_yaml
from ragen.run.jsonl import read_jsonl
from ragen.run.rundir import RunDir
from ragen.study.runner import StudyError, StudyState, run_key
from ragen.study.spec import EVAL_BEFORE, SFT, PlannedRun, changed_settings, flat_settings

LAUNCH_KEYS = frozenset({"model.spec", "trainer.eval_before_cache", "sft.warm_start"})
"""Settings a launch writes into a run's config.yaml beside what the study planned (the warm
start's checkpoint, the study's evaluation cache; `ragen sft` and a run's own warm start
turn sft.warm_start off), so never compared."""
STAGE_KEYS = frozenset({"trainer.max_minutes"})
"""Also rewritten in the RL stage of a run with its own warm start (the budget it left)."""
NOT_COPIED = ("checkpoints", ".*")
"""What of a kept run folder is not copied: checkpoints (a done run's are removed anyway),
a writer's lock, and hidden temporary files."""


def adopt(
    planned: list[PlannedRun],
    state: StudyState,
    kept: Path,
    say: Callable[[str], None] = print,
) -> list[PlannedRun]:
    """Copy the runs of ``planned`` that ``kept`` holds finished into their folders and
    mark them done in ``state``; returns them. Raises StudyError when ``kept`` is not a
    folder, its study.json is unreadable or another study's, or a kept run was run with
    other settings than ``planned`` gives it; ConfigError when its config.yaml cannot be
    read."""
    if not kept.is_dir():
        raise StudyError(f"--adopt {kept}: no such folder (a copy of a study folder's runs)")
    recorded = _kept_record(kept, state)
    _copy_evaluations(kept / EVAL_BEFORE, state.path.parent / EVAL_BEFORE, say)
    finished: dict[str, tuple[PlannedRun, Path, float | None]] = {}
    for run in planned:
        source = kept / run.name / f"seed-{run.seed}"
        if state.is_done(run) or run.root.exists() or not source.is_dir():
            continue
        _check_settings(run, source)
        why_not = _unfinished(run, source, recorded.get(run_key(run)))
        if why_not:
            say(f"not adopted: {source} ({why_not}); the study runs it")
            continue
        finished[run_key(run)] = (run, source, _minutes(source, recorded.get(run_key(run))))
    adopted = []
    for run in planned:
        if run_key(run) not in finished:
            continue
        if run.command == SFT and not _all_from_it_done(run, planned, state, finished):
            say(
                f"not adopted: {finished[run_key(run)][1]} (runs left start from its checkpoint, "
                "which logs do not hold); the study makes it again"
            )
            continue
        _, source, minutes = finished[run_key(run)]
        shutil.copytree(source, run.root, ignore=shutil.ignore_patterns(*NOT_COPIED))
        state.mark(run, "done", minutes=minutes, adopted_from=str(source))
        say(f"adopted {run.label} from {source}")
        adopted.append(run)
    return adopted


def _kept_record(kept: Path, state: StudyState) -> dict[str, dict]:
    """The runs ``kept``'s study.json records (none without one), read as the study reads its
    own: it must be the study and scale of ``state``."""
    try:
        return StudyState(kept, state.data["study"], state.data["scale"]).data["runs"]
    except StudyError as err:
        raise StudyError(f"--adopt {kept}: {err}") from None


def _check_settings(run: PlannedRun, source: Path) -> None:
    """Refuse a kept run whose config.yaml gives a setting another value than the study
    plans (a setting one side lacks, added or removed by a later ragen, is not compared, nor
    one of BOOKKEEPING)."""
    kept = json.loads(json.dumps(flat_settings(read_yaml(RunDir(source).config)), default=str))
    now = json.loads(json.dumps(run.settings(), default=str))
    skip = LAUNCH_KEYS | (STAGE_KEYS if now.get("sft.warm_start") is True else frozenset())
    changed = changed_settings(kept, now, skip)
    if changed:
        shown = ", ".join(f"{k} {kept[k]!r} → {now[k]!r}" for k in changed[:5])
        raise StudyError(
            f"{source} was run with other settings than the study gives {run.label}: {shown}"
            f"{' …' if len(changed) > 5 else ''}; adopt runs of this study file and scale only"
        )


def _unfinished(run: PlannedRun, source: Path, recorded: dict | None) -> str | None:
    """Why the kept ``source`` is not a finished run (None when it is): its study.json
    records it done, or its metrics.jsonl logs every step planned."""
    if recorded is not None:
        return None if recorded.get("status") == "done" else f"study.json: {recorded.get('status')}"
    steps = run.settings()["sft.steps" if run.command == SFT else "trainer.steps"]
    records = read_jsonl(RunDir(source).metrics).records
    # a hand-edited or damaged line's step may be anything: only whole numbers count
    logged = {r["step"] for r in records if type(r.get("step")) is int}
    if steps - 1 in logged:
        return None
    last = max(logged, default=None)
    return f"its metrics end at step {last} of {steps}, and no study.json says it was done"


def _minutes(source: Path, recorded: dict | None) -> float | None:
    """The kept run's minutes: its study.json's, else the span of its metrics' timestamps
    (a lower bound: the first step and an evaluation before training are not in it)."""
    if recorded is not None and isinstance(recorded.get("minutes"), int | float):
        return float(recorded["minutes"])
    records = read_jsonl(RunDir(source).metrics).records
    times = [r["time"] for r in records if _number(r.get("time"))]
    return round((max(times) - min(times)) / 60, 2) if len(times) > 1 else None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _all_from_it_done(
    warm: PlannedRun, planned: list[PlannedRun], state: StudyState, finished: dict
) -> bool:
    """Whether every run that starts from the warm start ``warm`` is done or adopted."""
    mine = [p for p in planned if p.warm_from and p.warm_from.parent.parent == warm.root]
    return all(state.is_done(p) or run_key(p) in finished for p in mine)


def _copy_evaluations(kept: Path, cache: Path, say: Callable[[str], None]) -> None:
    """Copy the kept evaluations (``*.json`` of an eval-before folder) that ``cache`` lacks."""
    if not kept.is_dir():
        return
    new = [f for f in sorted(kept.glob("*.json")) if f.is_file() and not (cache / f.name).exists()]
    if not new:
        return
    cache.mkdir(parents=True, exist_ok=True)
    for f in new:
        shutil.copy2(f, cache / f.name)
    say(f"copied {len(new)} kept evaluation(s) before training into {cache}")
