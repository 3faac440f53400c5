"""A study's table: each run's metric at its end, averaged over seeds, beside the paper's
figure, and whether each expected comparison held beyond the noise.

The standard error of a run's mean is the seeds' spread (sample standard deviation over
sqrt(seeds)) when it has two seeds or more. When the metric is an evaluation's success
(``eval/ENV/success``, whose episode count eval.jsonl records) it is at least the binomial
error of the mean over all the seeds' episodes: that part of the noise is known, and two
seeds that land close by chance would otherwise claim a precision their episodes do not
hold (the spread of two values has one degree of freedom). With one seed the binomial error
is all there is, and without episodes the error is unknown: a comparison without an error
is reported as untested, never as reproduced.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ragen.monitor.report import SIGNIFICANT_Z, RunData, series, summarize_run
from ragen.monitor.rundir import BEFORE_TRAINING
from ragen.study.spec import START, Expectation, Study

_EVAL_SUCCESS = re.compile(r"eval/(.+)/success")


@dataclass
class Measured:
    """A value of one run directory, with the episodes behind it when it is an evaluation's
    success (its binomial error needs them)."""

    value: float | None
    episodes: int | None = None


@dataclass
class SeedResult:
    """One run directory's figures."""

    seed: int
    steps: int
    start: Measured
    """The metric before training: the evaluation at step -1, or a train metric at step 0."""
    end: Measured
    """Mean of the metric's last ``tail`` logged values of training."""
    peak: float | None
    peak_step: int | None
    columns: dict[str, Measured]
    """The end value of each of the study's extra columns."""
    collapse_step: int | None
    warning_step: int | None
    minutes: float | None


@dataclass
class Estimate:
    """A mean over seeds and its standard error (None where unknown)."""

    mean: float | None
    se: float | None


@dataclass
class RowResult:
    """One run of the study over its seeds."""

    name: str
    preset: str
    seeds: list[SeedResult]
    end: Estimate
    start: Estimate
    paper: str | None
    columns: dict[str, Estimate]
    """The end value of each of the study's extra columns."""


@dataclass
class Verdict:
    """An expected comparison, judged: ``higher``'s mean minus ``lower``'s, in standard
    errors of the difference."""

    higher: str
    lower: str
    difference: float | None
    se: float | None
    z: float | None
    outcome: str


def seed_result(run: RunData, seed: int, study: Study, minutes: float | None) -> SeedResult:
    """The figures of one run directory for the study's metric and columns."""
    start, end, peak = ends_of(run, study.metric, study.tail)
    (row, *_) = summarize_run(run)  # alert timing is the same in every row
    return SeedResult(
        seed=seed,
        steps=run.steps,
        start=start,
        end=end,
        peak=peak[1] if peak else None,
        peak_step=peak[0] if peak else None,
        columns={c: ends_of(run, c, study.tail)[1] for c in study.columns},
        collapse_step=row.collapse_step,
        warning_step=row.warning_step,
        minutes=minutes,
    )


def ends_of(
    run: RunData, metric: str, tail: int
) -> tuple[Measured, Measured, tuple[int, float] | None]:
    """(start, end, (step, value) of the peak) of ``metric`` in one run directory."""
    steps, values = series(run.records, metric)
    trained = [(s, v) for s, v in zip(steps, values, strict=True) if s != BEFORE_TRAINING]
    before = [v for s, v in zip(steps, values, strict=True) if s == BEFORE_TRAINING]
    if not before and trained and trained[0][0] == 0 and not _EVAL_SUCCESS.fullmatch(metric):
        before = [trained[0][1]]  # a train metric's step 0 was sampled before any update
    start = Measured(before[0] if before else None, _episodes(run, metric, before=True))
    end_value = statistics.fmean(v for _, v in trained[-tail:]) if trained else None
    end = Measured(end_value, _episodes(run, metric, before=False) if tail == 1 else None)
    peak = max(trained, key=lambda sv: sv[1]) if trained else None
    return start, end, peak


def _episodes(run: RunData, metric: str, *, before: bool) -> int | None:
    """Episodes of the run's first evaluation before training (``before``) or of its last
    one after, when ``metric`` is an evaluation's success."""
    match = _EVAL_SUCCESS.fullmatch(metric)
    if match is None:
        return None
    mine = [
        e for e in run.evals if e["env"] == match[1] and (e["step"] == BEFORE_TRAINING) == before
    ]
    episodes = mine[-1].get("episodes") if mine else None
    return episodes if isinstance(episodes, int) and episodes > 0 else None


def estimate(values: Sequence[float | None], episodes: Sequence[int | None] = ()) -> Estimate:
    """The mean of the seeds' values (those measured) and its standard error (see the
    module's docstring); ``episodes`` holds each value's evaluation episodes, when known."""
    known = [v for v in values if v is not None]
    if not known:
        return Estimate(None, None)
    mean = statistics.fmean(known)
    spread = statistics.stdev(known) / math.sqrt(len(known)) if len(known) >= 2 else None
    counted = [n for v, n in zip(values, episodes, strict=False) if v is not None and n]
    binomial = None
    if len(counted) == len(known) and 0.0 <= mean <= 1.0:
        # Each value is a success rate over its own episodes: the mean's binomial variance
        # is the sum of each one's over the number of seeds squared.
        binomial = math.sqrt(mean * (1 - mean) * sum(1 / n for n in counted)) / len(known)
    if spread is None or binomial is None:
        return Estimate(mean, spread if binomial is None else binomial)
    return Estimate(mean, max(spread, binomial))


def over_seeds(measured: Sequence[Measured]) -> Estimate:
    """One value of a run (its end, start or a column) over its seeds."""
    return estimate([m.value for m in measured], [m.episodes for m in measured])


def judge(want: Expectation, rows: dict[str, RowResult]) -> Verdict:
    """Whether ``want.higher`` ended above ``want.lower`` beyond the noise."""
    high, low = _side(want.higher, rows), _side(want.lower, rows)
    if high.mean is None or low.mean is None:
        return Verdict(want.higher, want.lower, None, None, None, "not measured")
    difference = high.mean - low.mean
    if high.se is None or low.se is None:
        return Verdict(
            want.higher,
            want.lower,
            difference,
            None,
            None,
            "untested: no standard error with one seed (run with --seeds 2 or more)",
        )
    se = math.hypot(high.se, low.se)
    if se == 0:
        z = 0.0 if difference == 0 else math.copysign(math.inf, difference)
    else:
        z = difference / se
    if z >= SIGNIFICANT_Z:
        outcome = "reproduced"
    elif z > 0:
        outcome = f"the paper's direction, within the noise (under {SIGNIFICANT_Z:g} SE)"
    else:
        outcome = "not reproduced"
    return Verdict(want.higher, want.lower, difference, se, z, outcome)


def _side(name: str, rows: dict[str, RowResult]) -> Estimate:
    """The estimate an expectation names: a run's end, or with @start its start."""
    if name.endswith(START):
        return rows[name.removesuffix(START)].start
    return rows[name].end


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _shown(value: Estimate) -> str:
    return _num(value.mean) + (f" ± {value.se:.3f}" if value.se is not None else "")


def _steps(values: Sequence[int | None]) -> str:
    hit = [str(v) for v in values if v is not None]
    return f"{len(hit)}/{len(values)}" + (f" (steps {', '.join(hit)})" if hit else "")


def table_markdown(
    study: Study, scale: str, rows: Sequence[RowResult], verdicts: Sequence[Verdict]
) -> str:
    """table.md: the finding, the table, the verdicts, the wall time."""
    seeds = max(len(r.seeds) for r in rows)
    lines = [
        f"# {study.title}",
        "",
        f"Scale {scale}, {seeds} seed(s) per run. Finding: {study.finding}",
        f"Paper: {study.paper}",
        "",
        f"`{study.metric}` at the end of each run (mean of its last {study.tail} logged "
        "value(s)), averaged over the seeds:",
        "",
        "| run | preset | seeds | start | end (mean ± SE) | peak | "
        + "".join(f"{c} | " for c in study.columns)
        + "collapsed | first warning | wall time | paper |",
        "|---" * (10 + len(study.columns)) + "|",
    ]
    for row in rows:
        peaks = [s.peak for s in row.seeds if s.peak is not None]
        minutes = sum(s.minutes or 0.0 for s in row.seeds)
        cells = [
            row.name,
            f"`{row.preset}`",
            str(len(row.seeds)),
            _shown(row.start),
            _shown(row.end),
            _num(statistics.fmean(peaks)) if peaks else "—",
            *(_shown(row.columns[c]) for c in study.columns),
            _steps([s.collapse_step for s in row.seeds]),
            _steps([s.warning_step for s in row.seeds]),
            f"{minutes:.1f} min",
            row.paper or "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if verdicts:
        lines.append("")
    for v in verdicts:
        if v.difference is None:
            said = v.outcome
        elif v.z is None:
            said = f"{v.difference:+.3f}: {v.outcome}"
        else:
            said = f"{v.difference:+.3f} ± {v.se:.3f} (z {v.z:+.2f}): {v.outcome}"
        lines.append(f"- Expected {v.higher} above {v.lower}: {said}.")
    total = sum(s.minutes or 0.0 for r in rows for s in r.seeds)
    lines += ["", f"Wall time of all runs: {total:.1f} min."]
    return "\n".join(lines) + "\n"


def results_record(
    study: Study, scale: str, rows: Sequence[RowResult], verdicts: Sequence[Verdict]
) -> dict:
    """results.json: everything in the table, per seed."""
    return {
        "title": study.title,
        "finding": study.finding,
        "paper": study.paper,
        "scale": scale,
        "metric": study.metric,
        "columns": study.columns,
        "tail": study.tail,
        "runs": [asdict(r) for r in rows],
        "expect": [asdict(v) for v in verdicts],
    }
