"""The paper's Fig. 6 shape: the warning signals of every run that collapsed, on one axis of
steps counted from its collapse (0), so the runs' lead-up lines up whatever step each
collapsed at. Drawn with the report's own panels and alert marks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from ragen import metric_names as names
from ragen.report.curves import Panel, Plot, panel_series
from ragen.report.figures import draw
from ragen.report.runs import RunData
from ragen.run.rundir import BEFORE_TRAINING

ALIGNED = Plot(
    "aligned",
    "Around each collapse (x: steps from the run's collapse)",
    (
        Panel("train rollout success", (names.SUCCESS,)),
        Panel("in-group reward std", (names.REWARD_STD,)),
        Panel("entropy (nats)", (names.ENTROPY,)),
        Panel("gradient norm", (names.GRAD_NORM,), log_y=True),
    ),
)


def collapse_step(run: RunData) -> int | None:
    """The step of the run's first collapse alert."""
    return next((a.step for a in run.alerts if a.kind == "collapse"), None)


def aligned(run: RunData) -> RunData | None:
    """``run`` with its steps and alerts counted from its first collapse; None if it had none."""
    at = collapse_step(run)
    if at is None:
        return None
    records = [{**r, "step": r["step"] - at} for r in run.records if r["step"] != BEFORE_TRAINING]
    alerts = [dataclasses.replace(a, step=a.step - at) for a in run.alerts]
    return dataclasses.replace(run, records=records, alerts=alerts)


def write_aligned(runs: Sequence[RunData], out: Path, alpha: float) -> Path | None:
    """``out``/aligned.png over the runs that collapsed; None (nothing written) if none did."""
    shifted = [r for r in map(aligned, runs) if r is not None]
    if not shifted:
        return None
    panels = {p.title: panel_series(p, shifted, alpha) for p in ALIGNED.panels}
    panels = {title: curves for title, curves in panels.items() if curves}
    if not panels:
        return None
    figure = draw(ALIGNED, panels, shifted)
    path = out / f"{ALIGNED.name}.png"
    figure.savefig(path, dpi=110)
    return path
