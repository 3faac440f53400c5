"""What a finished study writes: the overlaid report of all its runs, the collapse-aligned
plot when the study asks for one, its table (table.md) and its figures (results.json)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragen.report.curves import DEFAULT_SMOOTHING
from ragen.report.runs import RunData, load_run
from ragen.report.write import write_report_of
from ragen.run.jsonl import to_json_line, write_atomic
from ragen.study.aligned import write_aligned
from ragen.study.runner import StudyState
from ragen.study.spec import TRAIN, PlannedRun, Study, expectations_at
from ragen.study.table import (
    RowResult,
    judge,
    results_record,
    row_result,
    seed_result,
    table_markdown,
)

REPORT_DIR = "report"
TABLE_FILE = "table.md"
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class StudyOutputs:
    files: list[Path]
    table: str


def rows_of(
    study: Study, planned: list[PlannedRun], state: StudyState, loaded: dict[Path, RunData]
) -> list[RowResult]:
    """Each study run's figures over its planned seeds, in the study file's order;
    ``loaded``: each planned folder's run data."""
    rows = []
    for run in study.runs:
        mine = [p for p in planned if p.name == run.name]
        if not mine:  # not part of this scale
            continue
        seeds = [seed_result(loaded[p.root], p.seed, study, state.minutes(p)) for p in mine]
        rows.append(row_result(run.name, mine[0].preset, seeds, run.paper, study.columns))
    return rows


def write_outputs(
    study: Study, scale: str, planned: list[PlannedRun], state: StudyState, out: Path
) -> StudyOutputs:
    """Write the report, table.md and results.json of a study whose runs have all ended
    (its warm starts, fine-tunings rather than runs it compares, left out)."""
    planned = [p for p in planned if p.command == TRAIN]
    runs = [load_run(p.root) for p in planned]  # read once: the report, plot and table share them
    report = write_report_of(runs, out / REPORT_DIR)
    files = list(report.files)
    aligned = (
        write_aligned(runs, out / REPORT_DIR, DEFAULT_SMOOTHING)
        if study.align_on_collapse
        else None
    )
    if aligned is not None:
        files.append(aligned)
    rows = rows_of(study, planned, state, {p.root: r for p, r in zip(planned, runs, strict=True)})
    by_name = {row.name: row for row in rows}
    verdicts = [judge(want, by_name) for want in expectations_at(study, scale)]
    table = table_markdown(study, scale, rows, verdicts)
    write_atomic(out / TABLE_FILE, table)
    record = results_record(study, scale, rows, verdicts)
    write_atomic(out / RESULTS_FILE, to_json_line(record) + "\n")  # an infinite z as null
    return StudyOutputs([*files, out / TABLE_FILE, out / RESULTS_FILE], table)
