"""``ragen study NAME --status``: where a study stands, read from its folder while it runs or
after it stopped. Each planned run is done, running, stopped (the study that ran it died:
the step its checkpoint resumes from, or none), failed, or still to run; then the time left
at the pace of the runs done, and the table of the runs done so far. It only reads: nothing
is launched, moved, locked or written, so it is safe beside the study's own process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ragen.report.runs import load_run
from ragen.run.jsonl import read_jsonl
from ragen.run.lock import holder
from ragen.run.machine import machines_of
from ragen.run.rundir import RunDir
from ragen.study.outputs import rows_of
from ragen.study.runner import StudyState, exit_reason, time_left
from ragen.study.spec import SFT, START, TRAIN, Expectation, PlannedRun, Study, expectations_at
from ragen.study.table import RowResult, judge, row_result, table_markdown
from ragen.train.checkpoint import complete_checkpoints, steps_done

DONE, RUNNING, STOPPED, FAILED, TO_RUN = "done", "running", "stopped", "failed", "to run"


@dataclass(frozen=True)
class RunProgress:
    """One planned run as its folder and study.json show it now."""

    run: PlannedRun
    status: str
    """DONE, RUNNING (a live process holds its folder's lock), STOPPED (study.json says
    running but no process does), FAILED or TO_RUN."""
    minutes: float | None
    logged: int
    """Steps in its metrics.jsonl (0 for a run not started)."""
    steps: int | None
    """Steps it is planned to take (``trainer.steps``, or ``sft.steps`` for a warm start);
    None where not asked (a run done or to run)."""
    checkpoint: int | None
    """The step its last intact checkpoint resumes from; None without one."""
    writer: str | None
    """The live process writing its folder (pid, host, since)."""
    exit_status: int | None = None


def progress_of(run: PlannedRun, state: StudyState) -> RunProgress:
    """``run``'s status, minutes and, for a run begun and not done, its steps and checkpoint."""
    entry = state.entry(run)
    recorded = entry.get("status")
    minutes = state.minutes(run)
    minutes = float(minutes) if isinstance(minutes, int | float) else None  # a hand edit
    if recorded == DONE:
        return RunProgress(run, DONE, minutes, 0, None, None, None)
    folder = RunDir(run.root)
    writer = holder(folder)
    if recorded is None and writer is None:
        return RunProgress(run, TO_RUN, None, 0, None, None, None)
    status = RUNNING if writer is not None else (FAILED if recorded == FAILED else STOPPED)
    logged = len(read_jsonl(folder.metrics).records)
    settings = run.settings()
    steps = settings["sft.steps" if run.command == SFT else "trainer.steps"]
    done = complete_checkpoints(folder)
    checkpoint = steps_done(done[-1]) if done else None
    code = entry.get("exit_status")
    exit_status = code if isinstance(code, int) else None
    return RunProgress(run, status, minutes, logged, steps, checkpoint, writer, exit_status)


def _line(p: RunProgress, width: int) -> str:
    label = f"{p.run.label:<{width}}"
    minutes = "" if p.minutes is None else f"  {p.minutes:6.1f} min"
    if p.status in (DONE, TO_RUN):
        return f"  {p.status:<8} {label}{minutes}".rstrip()
    said = f"  {p.status:<8} {label}{minutes}  {p.logged} of {p.steps} steps logged"
    if p.status == RUNNING:
        return f"{said}; written by {p.writer}"
    if p.status == FAILED and p.exit_status is not None:
        said += f", {exit_reason(p.exit_status)}"
    if p.checkpoint is None:
        aside = ", its folder set aside" if p.run.root.exists() else ""
        return f"{said}; no checkpoint: it starts again{aside}"
    return f"{said}; resumes from its checkpoint at step {p.checkpoint}"


def status_text(study_key: str, seeds: int, planned: list[PlannedRun], state: StudyState) -> str:
    """Each planned run's line, who runs the study, and the time left."""
    out = state.path.parent
    progress = [progress_of(p, state) for p in planned]
    done = sum(p.status == DONE for p in progress)
    warm = sum(p.command == SFT for p in planned)
    also = f" (the {len(planned)} include {warm} warm starts)" if warm else ""
    lines = [f"{study_key}, {seeds} seed(s), in {out}: {done} of {len(planned)} runs done{also}"]
    width = max(len(p.label) for p in planned)
    lines += [_line(p, width) for p in progress]
    lines += machine_lines(planned)
    runner = holder(RunDir(out))
    if done == len(planned):
        lines.append("all runs done: the same `ragen study` command writes the report and table")
    elif runner is not None:
        lines.append(f"the study is running: {runner}")
    else:
        lines.append("no study process is running: the same `ragen study` command goes on")
    left = time_left(planned, state)
    if left is not None and done < len(planned):
        lines.append(left.line())
    return "\n".join(lines) + "\n"


def machine_lines(planned: list[PlannedRun]) -> list[str]:
    """Where the runs ran (their machine.jsonl): one line when every run that records it ran
    on one machine; otherwise each machine with its runs, since the same settings give other
    numbers on another machine (model.dtype=auto, a CPU's kernels)."""
    on: dict[str, list[str]] = {}
    unrecorded = []
    for p in planned:
        if not p.root.exists():
            continue
        machines = machines_of(RunDir(p.root).machine)
        if not machines:
            unrecorded.append(p.label)
        for machine in machines:
            on.setdefault(machine, []).append(p.label)
    if not on:
        return []
    if len(on) == 1:
        lines = [f"ran on: {next(iter(on))}"]
    else:
        lines = [f"ran on {len(on)} machines, whose numbers differ for the same settings:"]
        lines += [f"  {machine}: {', '.join(labels)}" for machine, labels in on.items()]
    if unrecorded:
        lines.append(f"  no machine.jsonl (run before ragen recorded it): {', '.join(unrecorded)}")
    return lines


def on_common_seeds(
    want: Expectation, rows: dict[str, RowResult], columns: Sequence[str]
) -> dict[str, RowResult]:
    """``rows`` with the runs ``want`` compares cut to the seeds both have done: a mean over
    seeds 0 and 1 against one over seed 0 alone would compare the seeds as well as the runs."""
    names = {name.removesuffix(START) for name in (want.higher, want.lower)}
    if not names <= rows.keys():
        return rows
    common = set.intersection(*({s.seed for s in rows[name].seeds} for name in names))
    cut = dict(rows)
    for name in names:
        row = rows[name]
        seeds = [s for s in row.seeds if s.seed in common]
        cut[name] = row_result(name, row.preset, seeds, row.paper, columns)
    return cut


def table_so_far(
    study: Study, scale: str, planned: list[PlannedRun], state: StudyState
) -> str | None:
    """table.md of the runs done so far: each row over its seeds done, each expectation
    judged on the seeds both its runs have done (not measured before there is one); None
    before the first run is done."""
    done = [p for p in planned if p.command == TRAIN and state.is_done(p)]
    if not done:
        return None
    rows = rows_of(study, done, state, {p.root: load_run(p.root) for p in done})
    by_name = {r.name: r for r in rows}
    verdicts = [
        judge(want, on_common_seeds(want, by_name, study.columns))
        for want in expectations_at(study, scale)
    ]
    return table_markdown(study, scale, rows, verdicts)


def show_status(
    study: Study, study_key: str, scale: str, seeds: int, planned: list[PlannedRun], out: Path
) -> str:
    """What ``--status`` prints. Raises StudyError when ``out`` holds another study."""
    if not out.is_dir():
        return (
            f"nothing has run in {out} yet: {len(planned)} runs planned "
            "(`--plan` prints their commands)\n"
        )
    state = StudyState(out, study_key, scale)
    text = status_text(study_key, seeds, planned, state)
    table = table_so_far(study, scale, planned, state)
    if table is None:
        return text
    said = "each expectation judged on the seeds both its runs have done"
    return f"{text}\nThe runs done so far ({said}):\n\n{table}"
