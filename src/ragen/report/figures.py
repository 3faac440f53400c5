"""The figures of a report, drawn with matplotlib.

Each plot overlays the runs (one colour per run, legend label = the run directory's name),
draws the raw values faint and their EMA solid (the paper plots EMA-smoothed curves), and
marks each run's alerts: dotted vertical lines for warnings, dashed ones for collapses.

The figures are built on matplotlib's object API with the Agg canvas, so no pyplot state
or display is touched.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ragen import metric_names as names
from ragen.report.curves import Panel, Plot, Series
from ragen.report.runs import RunData

_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))  # five: the end reasons


def draw(plot: Plot, panels: dict[str, list[Series]], runs: Sequence[RunData]) -> Figure:
    """The figure of one plot. Each Line2D's gid is ``RUN|KEY|raw`` or ``RUN|KEY|smooth``."""
    shown = [p for p in plot.panels if p.title in panels]
    fig = Figure(figsize=(5.2 * len(shown), 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    colors = {run.name: f"C{i % 10}" for i, run in enumerate(runs)}
    for ax, panel in zip(fig.subplots(1, len(shown), squeeze=False)[0], shown, strict=True):
        _draw_panel(ax, panel, panels[panel.title], runs, colors)
    fig.suptitle(plot.title)
    return fig


def _draw_panel(ax, panel: Panel, curves: list[Series], runs, colors: dict[str, str]) -> None:
    """One colour per run; several keys of one run (eval envs, buckets) differ by line
    style, and by colour too when the panel shows one run."""
    keys = list(dict.fromkeys(c.key for c in curves))
    one_run = len({c.run for c in curves}) == 1
    for c in curves:
        label = f"{c.run} · {_short(c.key)}" if len(keys) > 1 else c.run
        style = _STYLES[keys.index(c.key) % len(_STYLES)]
        color = f"C{keys.index(c.key) % 10}" if one_run and len(keys) > 1 else colors[c.run]
        if panel.smooth:
            ax.plot(c.steps, c.raw, color=color, alpha=0.25, lw=0.8, gid=f"{c.run}|{c.key}|raw")
        ax.plot(
            c.steps,
            c.smooth,
            color=color,
            ls=style,
            lw=1.6,
            marker=None if panel.smooth else "o",  # sparse eval points stay visible
            ms=3,
            label=label,
            gid=f"{c.run}|{c.key}|smooth",
        )
    _mark_alerts(ax, [r for r in runs if r.name in {c.run for c in curves}], colors)
    ax.set_title(panel.title)
    ax.set_xlabel("step")
    if panel.log_y and all(v > 0 for c in curves for v in c.raw):
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


_NAMED = {names.GIGPO_EPISODE_ADV: "episode term", names.GIGPO_STEP_ADV: "step term × w"}
"""Labels of keys that share a panel with others and say little by their own name."""


def _short(key: str) -> str:
    """eval/sokoban/success -> sokoban, grad_norm/bucket_1/task -> bucket_1,
    rollout/return_end_terminated -> terminated, GiGPO's terms by name; other keys stay
    whole."""
    if key in _NAMED:
        return _NAMED[key]
    parts = key.split("/")
    if parts[0] in ("eval", "grad_norm") and len(parts) == 3:
        return parts[1]
    for prefix in ("rollout/return_end_", "rollout/end_"):
        if key.startswith(prefix):
            return key.removeprefix(prefix)
    return key


def _mark_alerts(ax, runs: Sequence[RunData], colors: dict[str, str]) -> None:
    drawn = set()
    for run in runs:
        for alert in run.alerts:
            style = ":" if alert.kind == "warning" else "--"
            ax.axvline(alert.step, color=colors[run.name], ls=style, lw=1, alpha=0.8)
            drawn.add(alert.kind)
    # one legend entry per alert kind, drawn off-canvas (no data)
    for kind in sorted(drawn, reverse=True):
        style = ":" if kind == "warning" else "--"
        ax.add_line(Line2D([], [], color="0.3", ls=style, lw=1, label=kind))
