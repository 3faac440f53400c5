"""The curves of a report: which metrics each plot and panel shows, and the data behind every
line (raw values and their EMA), computed apart from the drawing so tests can compare it with
metrics.jsonl."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field

from ragen import metric_names as names
from ragen.monitor.collapse import is_finite_number
from ragen.report.runs import RunData

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
    """One PNG file of side-by-side panels; ``warm_starts``: each run's warm start (its
    `ragen sft` stage, steps counted from its own start) is drawn too, after the runs."""

    name: str
    title: str
    panels: tuple[Panel, ...]
    warm_starts: bool = False


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
        warm_starts=True,
    ),
    Plot("grad_norm", "Gradient norm", (Panel("gradient norm", (names.GRAD_NORM,), log_y=True),)),
    Plot(
        "grad_buckets",
        "Gradient norm of each loss term, by reward-variance bucket",
        tuple(
            Panel(title, (names.bucket_metric("*", term),), smooth=False, log_y=True)
            for term, title in (
                ("task", "task (policy loss)"),
                ("entropy", "entropy term"),
                ("kl", "KL term"),
                ("value", "value loss"),
            )
        ),
    ),
    Plot(
        "credit",
        "GiGPO's per-turn credit",
        (
            Panel("turns sharing their state with another", (names.GIGPO_ANCHORED_SHARE,)),
            Panel(
                "mean |advantage| of each term",
                (names.GIGPO_EPISODE_ADV, names.GIGPO_STEP_ADV),
            ),
        ),
    ),
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


def logged_keys(records: Sequence[dict]) -> list[str]:
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
        for key in _keys(panel, logged_keys(run.records)):
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
        drawn = plotted(plot, runs)
        panels = {p.title: panel_series(p, drawn, alpha) for p in plot.panels}
        panels = {title: curves for title, curves in panels.items() if curves}
        if panels:
            data[plot.name] = panels
    return data


def plotted(plot: Plot, runs: Sequence[RunData]) -> list[RunData]:
    """The runs ``plot`` draws: ``runs``, then their warm starts if it shows them."""
    stages = [r.warm_start for r in runs if r.warm_start is not None] if plot.warm_starts else []
    return [*runs, *stages]
