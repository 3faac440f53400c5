"""Writing a report: PNG plots of the training curves and a summary.md, for one run or several.

A series a run did not log is left out; a plot with nothing to show is not written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ragen.report.curves import DEFAULT_SMOOTHING, PLOTS, plot_data, plotted
from ragen.report.figures import draw
from ragen.report.runs import RunData, load_run
from ragen.report.summary import story, summary_markdown
from ragen.run.jsonl import RunDirError


@dataclass(frozen=True)
class Report:
    """What `write_report` wrote, and what happened in words (summary.md's first lines)."""

    files: list[Path]
    story: list[str]


def write_report(
    roots: Sequence[str | Path],
    out: str | Path,
    *,
    alpha: float = DEFAULT_SMOOTHING,
    replay_with: Sequence[str] | None = None,
) -> Report:
    """Write ``out``/PLOT.png for every plot with data, and ``out``/summary.md; returns the
    paths written and the story. ``replay_with``: see `load_run`."""
    out = Path(out)
    _check_out(out)
    return write_report_of([load_run(root, replay_with) for root in roots], out, alpha=alpha)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise RunDirError(
            f"--out {out} is a file: name a folder (a report is several files), e.g. {out}.d"
        )


def write_report_of(
    runs: list[RunData], out: str | Path, *, alpha: float = DEFAULT_SMOOTHING
) -> Report:
    """`write_report` of runs already loaded; runs that share a name are renamed after
    their folder's last two parts (the legend tells them apart by name)."""
    out = Path(out)
    _check_out(out)
    if len({r.name for r in runs}) != len(runs):
        # the legend tells runs apart by name: runs/a/seed0 and runs/b/seed0 become a/seed0
        for run in runs:
            run.name = "/".join(run.root.resolve().parts[-2:])
            if run.warm_start is not None:
                run.warm_start.name = f"{run.name}/{run.warm_start.root.name}"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    data = plot_data(runs, alpha)
    for plot in PLOTS:
        if plot.name in data:
            path = out / f"{plot.name}.png"
            draw(plot, data[plot.name], plotted(plot, runs)).savefig(path, dpi=110)
            written.append(path)
    summary = out / "summary.md"
    summary.write_text(summary_markdown(runs), encoding="utf-8")
    return Report([*written, summary], story(runs))
