"""What a report reads from a run directory: its metrics, its alerts (from alerts.jsonl, or
replayed through the collapse detector) and its evaluation summaries."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from ragen.monitor.collapse import Alert, is_finite_number, replay
from ragen.monitor.settings import detector_settings
from ragen.run.jsonl import RunDirError, read_jsonl
from ragen.run.rundir import BEFORE_TRAINING, RunDir, check_metrics, read_stage_record


@dataclass
class RunData:
    """What a report reads from one run directory."""

    name: str
    root: Path
    records: list[dict]
    """metrics.jsonl objects with a step, in step order, after a first record at step -1
    (BEFORE_TRAINING) with the ``eval/<env>/success`` of the evaluation before training
    when the run made one (``trainer.eval_before``)."""
    alerts: list[Alert]
    alerts_source: str
    """'alerts.jsonl', or 'replayed, ' and the detector settings used (see
    `detector_settings`) when the run has no alerts.jsonl or a replay was asked for."""
    skipped_lines: int = 0
    """Torn or junk lines of metrics.jsonl that were skipped."""
    evals: list[dict] = field(default_factory=list)
    """eval.jsonl objects with an int step, an env and a success, in file order; of an
    evaluation folder, its summaries (no step)."""
    evaluation: bool = False
    """The folder of a standalone evaluation (`ragen eval --out`): no training, no metrics."""
    warm_start: RunData | None = None
    """The `ragen sft` stage the run began with (RUN/warm_start, ``sft.warm_start``), read as
    a run of its own and named RUN/warm_start; None without one."""
    stage: dict | None = None
    """Of a warm start: its stage.json (steps, minutes, the checkpoint RL started from);
    None when it has none, or one that cannot be read."""

    @property
    def steps(self) -> int:
        """Training steps logged (the evaluation before training is not one)."""
        return sum(r["step"] != BEFORE_TRAINING for r in self.records)


def load_run(root: str | Path, replay_with: Sequence[str] | None = None) -> RunData:
    """Read a run's metrics and alerts; without alerts.jsonl the alerts are recomputed by
    replaying the metrics through the detector with the run's own settings.
    ``replay_with`` (``key=value`` detector settings over the run's own, possibly none)
    replays every run, alerts.jsonl or not: to read old runs with other thresholds."""
    run = RunDir(Path(root))
    if not run.metrics.exists() and run.evals.is_file():
        return _load_evaluation(run)
    check_metrics(run)
    read = read_jsonl(run.metrics)
    records = sorted(
        (r for r in read.records if isinstance(r.get("step"), int)), key=lambda r: r["step"]
    )
    if replay_with is None and run.alerts.is_file():
        fields = Alert.__dataclass_fields__.keys()
        alerts = [
            Alert.from_record(r) for r in read_jsonl(run.alerts).records if fields <= r.keys()
        ]
        source = "alerts.jsonl"
    else:
        settings, described = detector_settings(run, replay_with or ())
        alerts, source = replay(records, settings), f"replayed, {described}"
    evals = read_evals(run)
    before = {e["env"]: e["success"] for e in evals if e["step"] == BEFORE_TRAINING}
    if before:
        first = {"step": BEFORE_TRAINING, **{f"eval/{env}/success": v for env, v in before.items()}}
        records = [first, *records]
    name = run.root.resolve().name
    data = RunData(name, run.root, records, alerts, source, len(read.skipped), evals)
    if run.warm_start.metrics.is_file():
        data.warm_start = load_run(run.warm_start.root, replay_with)
        data.warm_start.name = f"{name}/{run.warm_start.root.name}"
        with suppress(RunDirError):  # a damaged stage.json: the stage without its minutes
            data.warm_start.stage = read_stage_record(run.warm_start)
    return data


def _load_evaluation(run: RunDir) -> RunData:
    """An evaluation folder as a run without steps: its summaries (an env name and a success
    in [0, 1]), in file order."""
    evals = [
        r
        for r in read_jsonl(run.evals).records
        if isinstance(r.get("env"), str)
        and is_finite_number(r.get("success"))
        and 0.0 <= r["success"] <= 1.0
    ]
    name = run.root.resolve().name
    return RunData(name, run.root, [], [], "none", evals=evals, evaluation=True)


def read_evals(run: RunDir) -> list[dict]:
    """The run's evaluation summaries that a report can use (an int step, an env name, a
    success in [0, 1]); none when the run has no eval.jsonl."""
    if not run.evals.is_file():
        return []
    return [
        r
        for r in read_jsonl(run.evals).records
        if isinstance(r.get("step"), int)
        and isinstance(r.get("env"), str)
        and is_finite_number(r.get("success"))
        and 0.0 <= r["success"] <= 1.0
    ]
