"""Run reports: PNG plots of the training curves and a summary.md, for one run or several.

Each plot overlays the runs (one colour per run, legend label = the run directory's name),
draws the raw values faint and their EMA solid (the paper plots EMA-smoothed curves), and
marks each run's alerts: dotted vertical lines for warnings, dashed ones for collapses. A
series a run did not log is left out; a plot with nothing to show is not written.

The figures are built on matplotlib's object API with the Agg canvas, so no pyplot state
or display is touched. The data behind every line (:func:`plot_data`) is computed apart from
the drawing, so tests can compare it with metrics.jsonl.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ragen import metric_names as names
from ragen.monitor.collapse import Alert, detector_settings, is_finite_number, replay
from ragen.monitor.jsonl import RunDirError, read_jsonl
from ragen.monitor.paired import paired_summaries
from ragen.monitor.rundir import BEFORE_TRAINING, RunDir, check_metrics

DEFAULT_SMOOTHING = 0.1
"""EMA weight of one step in the smoothed curves (about TensorBoard's smoothing 0.9)."""


@dataclass(frozen=True)
class Panel:
    """One axes. ``keys`` are metric names; ``a|b`` takes the first one a run logged and
    ``eval/*/success`` every match. ``smooth=False`` plots points as they are (the paper
    smooths everything but the evaluation success)."""

    title: str
    keys: tuple[str, ...]
    smooth: bool = True
    log_y: bool = False


@dataclass(frozen=True)
class Plot:
    """One PNG file of side-by-side panels."""

    name: str
    title: str
    panels: tuple[Panel, ...]


PLOTS = (
    Plot(
        "success",
        "Success",
        (
            Panel("train rollouts", (names.SUCCESS,)),
            Panel("evaluation (fixed seeds)", ("eval/*/success",), smooth=False),
        ),
    ),
    Plot(
        "reward",
        "Reward",
        (
            Panel("reward mean", (names.REWARD_MEAN,)),
            Panel("in-group reward std", (names.REWARD_STD,)),
        ),
    ),
    Plot("entropy", "Token entropy", (Panel("entropy (nats)", (names.ENTROPY,)),)),
    Plot(
        "sft",
        "Supervised fine-tuning (ragen sft)",
        (
            Panel("loss (NLL per reply token)", (names.SFT_LOSS,)),
            Panel("gradient norm", (names.SFT_GRAD_NORM,), log_y=True),
        ),
    ),
    Plot("grad_norm", "Gradient norm", (Panel("gradient norm", (names.GRAD_NORM,), log_y=True),)),
    Plot(
        "length",
        "Reply and think length",
        (
            Panel("reply tokens", (names.REPLY_TOKENS,)),
            Panel("think tokens", ("think/tokens_mean|rollout/think_tokens",)),
        ),
    ),
    Plot(
        "endings",
        "How episodes ended",
        (
            Panel("share of episodes", ("rollout/end_*",)),
            # a way of ending that pays more than playing on is one the policy learns
            Panel("mean return of those episodes", ("rollout/return_end_*",)),
        ),
    ),
    Plot(
        "diversity",
        "Diversity and template collapse",
        (
            Panel("distinct replies in a group", (names.DISTINCT_REPLY,)),
            Panel("distinct think bigrams", (names.DISTINCT_THINK,)),
            Panel("episodes playing one action sequence", (names.ACTION_TEMPLATE_SHARE,)),
            Panel("prompt-reasoning MI (nats)", (names.MI,)),
            Panel("prompt retrieval accuracy", (names.RETRIEVAL_ACC,)),
        ),
    ),
)


# ---------------------------------------------------------------------------- runs


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
    """eval.jsonl objects with an int step, an env and a success, in file order."""

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
    return RunData(name, run.root, records, alerts, source, len(read.skipped), evals)


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


# ---------------------------------------------------------------------------- data


def ema(steps: Sequence[int], values: Sequence[float], alpha: float) -> list[float]:
    """Debiased EMA in step time: a point ``k`` steps after the previous one weighs as ``k``
    steps would (sparse series such as the MI estimate stay in step with the others)."""
    out, mean, weight, last = [], 0.0, 0.0, None
    for step, value in zip(steps, values, strict=True):
        gap = 1 if last is None else max(1, step - last)
        a = 1.0 - (1.0 - alpha) ** gap
        mean = (1 - a) * mean + a * value
        weight = (1 - a) * weight + a
        out.append(mean / weight)
        last = step
    return out


@dataclass
class Series:
    """One curve of one run: its steps and raw values, and what is drawn solid."""

    run: str
    key: str
    steps: list[int]
    raw: list[float]
    smooth: list[float] = field(default_factory=list)


def series(records: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key``; steps without a finite number for it are left out."""
    steps, values = [], []
    for r in records:
        v = r.get(key)
        if is_finite_number(v):
            steps.append(r["step"])
            values.append(float(v))
    return steps, values


def _logged(records: Sequence[dict]) -> list[str]:
    """Every key of the records, in the order they first appear (eval envs in config order)."""
    return list(dict.fromkeys(k for r in records for k in r))


def _keys(panel: Panel, available: list[str]) -> list[str]:
    found: list[str] = []
    for key in panel.keys:
        if "*" in key:
            found += fnmatch.filter(available, key)
        else:
            found += [k for k in key.split("|") if k in available][:1]
    return found


def panel_series(panel: Panel, runs: Sequence[RunData], alpha: float) -> list[Series]:
    """Every curve of ``panel``, run by run."""
    out = []
    for run in runs:
        for key in _keys(panel, _logged(run.records)):
            steps, raw = series(run.records, key)
            if steps:
                smooth = ema(steps, raw, alpha) if panel.smooth else list(raw)
                out.append(Series(run.name, key, steps, raw, smooth))
    return out


def plot_data(
    runs: Sequence[RunData], alpha: float = DEFAULT_SMOOTHING
) -> dict[str, dict[str, list[Series]]]:
    """{plot name: {panel title: curves}}, only plots and panels with at least one curve."""
    data = {}
    for plot in PLOTS:
        panels = {p.title: panel_series(p, runs, alpha) for p in plot.panels}
        panels = {title: curves for title, curves in panels.items() if curves}
        if panels:
            data[plot.name] = panels
    return data


# ---------------------------------------------------------------------------- drawing

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
    """One colour per run; several keys of one run (eval envs) differ by line style."""
    keys = list(dict.fromkeys(c.key for c in curves))
    for c in curves:
        label = f"{c.run} · {_short(c.key)}" if len(keys) > 1 else c.run
        style = _STYLES[keys.index(c.key) % len(_STYLES)]
        if panel.smooth:
            ax.plot(
                c.steps, c.raw, color=colors[c.run], alpha=0.25, lw=0.8, gid=f"{c.run}|{c.key}|raw"
            )
        ax.plot(
            c.steps,
            c.smooth,
            color=colors[c.run],
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


def _short(key: str) -> str:
    """eval/sokoban/success -> sokoban, rollout/return_end_terminated -> terminated; other
    keys stay whole."""
    parts = key.split("/")
    if parts[0] == "eval" and len(parts) == 3:
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


# ---------------------------------------------------------------------------- summary


@dataclass
class RunSummary:
    """One row of summary.md: the success curve it reads, and the alerts' timing."""

    run: str
    success_of: str
    before: float | None
    """Success of the starting policy: the evaluation before training, or for the train
    rollouts those of step 0 (sampled before its update); None when not measured."""
    peak: float | None
    peak_step: int | None
    final: float | None
    collapse_step: int | None
    warning_step: int | None

    @property
    def lead_time(self) -> int | None:
        """Steps from the first warning to the collapse (None unless the warning came first)."""
        if self.collapse_step is None or self.warning_step is None:
            return None
        lead = self.collapse_step - self.warning_step
        return lead if lead >= 0 else None


def summarize_run(run: RunData) -> list[RunSummary]:
    """One row per evaluated env (before training, peak, final); with no evaluation, one
    row on the train rollouts' success instead."""
    keys = fnmatch.filter(_logged(run.records), "eval/*/success")
    sources = [(k, k.split("/")[1]) for k in keys] or [(names.SUCCESS, "train rollouts")]
    collapse = next((a.step for a in run.alerts if a.kind == "collapse"), None)
    warning = next((a.step for a in run.alerts if a.kind == "warning"), None)
    rows = []
    for key, label in sources:
        steps, values = series(run.records, key)
        start = BEFORE_TRAINING if key != names.SUCCESS else 0
        best = max(range(len(values)), key=values.__getitem__) if values else None
        rows.append(
            RunSummary(
                run=run.name,
                success_of=label,
                before=values[0] if steps and steps[0] == start else None,
                peak=values[best] if best is not None else None,
                peak_step=steps[best] if best is not None else None,
                final=values[-1] if values and steps[-1] != BEFORE_TRAINING else None,
                collapse_step=collapse,
                warning_step=warning,
            )
        )
    return rows


def _cell(value) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def summary_markdown(runs: Sequence[RunData]) -> str:
    """summary.md: what happened in words, a table of every run's success and alert
    timing, then notes."""
    lines = ["# Run summary", "", *story(runs), ""]
    lines += [
        "| run | success of | before training | peak (step) | final | collapse step "
        "| first warning | lead time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for s in summarize_run(run):
            peak = f"{_cell(s.peak)} ({_cell(s.peak_step)})" if s.peak is not None else "—"
            cells = [s.run, s.success_of, _cell(s.before), peak, _cell(s.final)]
            cells += [_cell(s.collapse_step), _cell(s.warning_step), _cell(s.lead_time)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Before training is the evaluation made before the first update (step -1 in the",
        "plots; `trainer.eval_before=true`), or for the train rollouts those of step 0. Lead",
        "time counts the steps from the first warning to the collapse. Alerts come from each",
        "run's alerts.jsonl, or are replayed from metrics.jsonl through the detector where a",
        "run has none:",
        "",
    ]
    for run in runs:
        torn = f"; {run.skipped_lines} torn line(s) skipped" if run.skipped_lines else ""
        lines.append(
            f"- {run.name}: {run.steps} steps, {len(run.alerts)} alert(s) "
            f"({run.alerts_source}){torn}"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- in words

SIGNIFICANT_Z = 2.0
"""A change of success counts as beyond the noise at two standard errors of the difference."""


def difference_z(before: dict, after: dict) -> float:
    """The change of success from ``before`` to ``after`` (evaluation summaries with
    ``success`` and ``episodes``) in standard errors of the difference of two proportions;
    infinite when both are certain (0 or 1) and differ."""
    p, q = before["success"], after["success"]
    var = p * (1 - p) / before["episodes"] + q * (1 - q) / after["episodes"]
    if var == 0:
        return 0.0 if p == q else math.copysign(math.inf, q - p)
    return (q - p) / math.sqrt(var)


def _verdict(z: float) -> str:
    if z >= SIGNIFICANT_Z:
        return "a gain beyond the noise"
    if z <= -SIGNIFICANT_Z:
        return "a loss beyond the noise"
    return f"within the noise (under {SIGNIFICANT_Z:g} standard errors)"


def _counted(summary: dict) -> bool:
    episodes = summary.get("episodes")
    return isinstance(episodes, int) and not isinstance(episodes, bool) and episodes > 0


def _eval_story(run: RunData) -> list[str]:
    """A sentence per evaluated env: before training against the last evaluation."""
    out = []
    for env in dict.fromkeys(e["env"] for e in run.evals):
        mine = [e for e in run.evals if e["env"] == env]
        before = next((e for e in reversed(mine) if e["step"] == BEFORE_TRAINING), None)
        after = next((e for e in reversed(mine) if e["step"] != BEFORE_TRAINING), None)
        if after is None:
            continue
        final = f"{after['success']:.1%} after step {after['step']}"
        if before is None:
            out.append(
                f"{env}: {final}; no evaluation before training to set it beside "
                "(trainer.eval_before=true makes one)."
            )
            continue
        change = f"{env}: {before['success']:.1%} before training, {final}"
        if not (_counted(before) and _counted(after)):
            out.append(f"{change}.")
            continue
        points = 100 * (after["success"] - before["success"])
        paired = paired_summaries([before], [after])
        if paired is not None:
            z = paired.z
            read = (
                f"{z:+.1f} SE level by level on {paired.levels} levels: {paired.gained} "
                f"gained, {paired.lost} lost"
            )
        else:
            z = difference_z(before, after)
            sizes = {before["episodes"], after["episodes"]}
            episodes = f"{sizes.pop()} episodes" if len(sizes) == 1 else "episodes"
            read = f"{z:+.1f} SE on {episodes}"
        out.append(f"{change} ({points:+.1f} points, {read}): {_verdict(z)}.")
    return out


def _alert_story(run: RunData) -> str:
    warnings = [a for a in run.alerts if a.kind == "warning"]
    collapse = next((a for a in run.alerts if a.kind == "collapse"), None)
    if collapse is None and not warnings:
        return "The collapse monitor raised no alert."
    said = []
    if warnings:
        first = warnings[0]
        said.append(f"warned first at step {first.step} ({first.signal}: {first.message})")
    if collapse is not None:
        said.append(
            f"saw a collapse at step {collapse.step} ({collapse.signal}: {collapse.message})"
        )
    return f"The collapse monitor {' and '.join(said)}."


def story(runs: Sequence[RunData]) -> list[str]:
    """What happened in each run, in words: success before and after training with its
    standard error, and what the collapse monitor saw."""
    lines = []
    for run in runs:
        head = f"{run.name} ({run.steps} steps): " if len(runs) > 1 else ""
        told = _eval_story(run) or [_row_story(row) for row in summarize_run(run)]
        lines.append(head + " ".join([*filter(None, told), _alert_story(run)]))
    return lines


def _row_story(row: RunSummary) -> str:
    """A run without eval.jsonl summaries (no episode counts): the curve's ends only."""
    if row.final is None:
        return ""
    start = "" if row.before is None else f"{row.before:.1%} at the start, "
    return f"{row.success_of} success: {start}{row.final:.1%} at the end."


# ---------------------------------------------------------------------------- all of it


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
    out.mkdir(parents=True, exist_ok=True)
    written = []
    data = plot_data(runs, alpha)
    for plot in PLOTS:
        if plot.name in data:
            path = out / f"{plot.name}.png"
            draw(plot, data[plot.name], runs).savefig(path, dpi=110)
            written.append(path)
    summary = out / "summary.md"
    summary.write_text(summary_markdown(runs), encoding="utf-8")
    return Report([*written, summary], story(runs))
