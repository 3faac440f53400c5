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

Two sides that are evaluations of the same levels (a run's end against its start, or two
runs evaluated on the same fixed seeds) are compared level by level where every seed's
evaluation holds its levels' outcomes (ragen.report.paired): the error of the difference is
then the paired one, or the seeds' spread where that is wider. The seeds' spread of a
difference is the wider of two readings: the two means' errors as if independent, and,
where both sides have the same seeds, the spread of the per-seed differences. A seed's runs
share its warm start and levels, and a run's start and end are one run, so the sides move
together (the first reading is then the wider) or against each other (regression to the
mean: the second is). A comparison one of whose seeds logged no value (a run killed before
its final evaluation, read as it stands) is not measured: the mean of the others would drop
that seed unseen.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import groupby

from ragen import metric_names as names
from ragen.report.curves import series
from ragen.report.paired import PairedChange, paired_summaries, seed_successes
from ragen.report.runs import RunData
from ragen.report.summary import SIGNIFICANT_Z, summarize_run
from ragen.run.rundir import BEFORE_TRAINING, SEED_SUCCESSES
from ragen.study.spec import START, Expectation, Study

_EVAL_SUCCESS = re.compile(r"eval/(.+)/success")


@dataclass
class Measured:
    """A value of one run directory, with the episodes behind it when it is an evaluation's
    success (its binomial error needs them) and, where the evaluation recorded them, its
    levels' outcomes (``seeds``, ``k`` and ``seed_successes``, as the summary holds them)."""

    value: float | None
    episodes: int | None = None
    levels: dict | None = None
    template_share: float | None = None
    """The share of the evaluation's episodes that played its most frequent failed action
    sequence, ``template`` (the Echo Trap's mark, :func:`ragen.monitor.metrics.action_template`)."""
    template: list[str] | None = None


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
    change: PairedChange | None = None
    """The level-by-level change from ``start`` to ``end``, where both evaluations hold their
    levels' outcomes for the same levels."""
    spread: float | None = None
    """The mean share of a training step's groups whose episodes' returns differed
    (:func:`group_spread`)."""


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
    paired_levels: int | None = None
    """The levels the two sides were compared on one by one; None: as independent means."""


def row_result(
    name: str, preset: str, seeds: list[SeedResult], paper: str | None, columns: Sequence[str]
) -> RowResult:
    """One run of the study over its ``seeds``: its end, start and ``columns`` over them."""
    return RowResult(
        name=name,
        preset=preset,
        seeds=seeds,
        end=over_seeds([s.end for s in seeds]),
        start=over_seeds([s.start for s in seeds]),
        paper=paper,
        columns={c: over_seeds([s.columns[c] for s in seeds]) for c in columns},
    )


def seed_result(run: RunData, seed: int, study: Study, minutes: float | None) -> SeedResult:
    """The figures of one run directory for the study's metric and columns."""
    start, end, peak = ends_of(run, study.metric, study.tail)
    (row, *_) = summarize_run(run)  # alert timing is the same in every row
    paired = (
        paired_summaries([start.levels], [end.levels])
        if start.levels is not None and end.levels is not None
        else None
    )
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
        change=paired,
        spread=group_spread(run.records),
    )


_GROUP_KEYS = (names.KEPT_GROUPS, names.KEPT_RATIO, names.ZERO_STD_GROUPS)


def group_spread(records: Sequence[dict]) -> float | None:
    """The mean share, over the training steps, of the rollout groups whose episodes' returns
    differed. GRPO's advantage, and GiGPO's episode term, is 0 in a group that played alike,
    so where few groups differ those estimators have little to learn from, whatever their
    credit. A step's groups are ``filter/kept_groups`` over ``filter/kept_ratio``; a step
    that kept none, or one without the filter's metrics, is left out (None: no step left)."""
    shares = []
    for r in records:
        kept, ratio, alike = (r.get(k) for k in _GROUP_KEYS)
        if (
            isinstance(kept, int | float)
            and isinstance(ratio, int | float)
            and isinstance(alike, int | float)
            and kept > 0
            and ratio > 0
        ):
            shares.append(1.0 - alike * ratio / kept)
    return statistics.fmean(shares) if shares else None


def ends_of(
    run: RunData, metric: str, tail: int
) -> tuple[Measured, Measured, tuple[int, float] | None]:
    """(start, end, (step, value) of the peak) of ``metric`` in one run directory."""
    steps, values = series(run.records, metric)
    trained = [(s, v) for s, v in zip(steps, values, strict=True) if s != BEFORE_TRAINING]
    before = [v for s, v in zip(steps, values, strict=True) if s == BEFORE_TRAINING]
    if not before and trained and trained[0][0] == 0 and not _EVAL_SUCCESS.fullmatch(metric):
        before = [trained[0][1]]  # a train metric's step 0 was sampled before any update
    start = _measured(before[0] if before else None, _evaluation(run, metric, before=True))
    end_value = statistics.fmean(v for _, v in trained[-tail:]) if trained else None
    last = _evaluation(run, metric, before=False) if tail == 1 else None
    end = _measured(end_value, last)
    peak = max(trained, key=lambda sv: sv[1]) if trained else None
    return start, end, peak


def _evaluation(run: RunData, metric: str, *, before: bool) -> dict | None:
    """The run's last evaluation summary before training (``before``) or after it, when
    ``metric`` is an evaluation's success."""
    match = _EVAL_SUCCESS.fullmatch(metric)
    if match is None:
        return None
    mine = [
        e for e in run.evals if e["env"] == match[1] and (e["step"] == BEFORE_TRAINING) == before
    ]
    return mine[-1] if mine else None


def _measured(value: float | None, evaluation: dict | None) -> Measured:
    """``value`` with its evaluation's episode count, levels' outcomes and action template,
    where known (eval.jsonl may hold a hand-edited or older line: what does not fit is left
    out)."""
    if evaluation is None:
        return Measured(value)
    episodes = evaluation.get("episodes")
    counted = episodes if isinstance(episodes, int) and episodes > 0 else None
    levels = None
    if seed_successes(evaluation) is not None:  # the keys the paired comparison reads
        levels = {key: evaluation[key] for key in ("seeds", "k", SEED_SUCCESSES)}
    share, template = evaluation.get("action_template_share"), evaluation.get("action_template")
    if isinstance(share, bool) or not (isinstance(share, int | float) and 0.0 <= share <= 1.0):
        share = None
    if not (isinstance(template, list) and all(isinstance(a, str) for a in template)):
        template = None
    return Measured(value, counted, levels, share, template)


def over_seeds(measured: Sequence[Measured]) -> Estimate:
    """One value of a run (its end, start or a column) over its seeds: the mean of those
    measured and its standard error (see the module's docstring)."""
    values = [m.value for m in measured if m.value is not None]
    if not values:
        return Estimate(None, None)
    mean = statistics.fmean(values)
    spread = _spread(measured)
    counted = [m.episodes for m in measured if m.value is not None and m.episodes]
    if len(counted) < len(values) or not 0.0 <= mean <= 1.0:
        return Estimate(mean, spread)
    # Each value is a success rate over its own episodes: the mean's binomial variance is
    # the sum of each one's over the number of seeds squared.
    binomial = math.sqrt(mean * (1 - mean) * sum(1 / n for n in counted)) / len(values)
    return Estimate(mean, binomial if spread is None else max(spread, binomial))


def judge(want: Expectation, rows: dict[str, RowResult]) -> Verdict:
    """Whether ``want.higher`` ended above ``want.lower`` beyond the noise; not measured
    where ``rows`` lacks either run (a study's table before that run has a seed done)."""
    if any(name.removesuffix(START) not in rows for name in (want.higher, want.lower)):
        return Verdict(want.higher, want.lower, None, None, None, "not measured")
    missing = [
        f"{name} seed {seed}"
        for name in (want.higher, want.lower)
        for seed, value in _by_seed(name, rows).items()
        if value is None
    ]
    if missing:
        said = f"not measured: {', '.join(missing)} logged no value"
        return Verdict(want.higher, want.lower, None, None, None, said)
    high, low = _side(want.higher, rows), _side(want.lower, rows)
    if high.mean is None or low.mean is None:
        return Verdict(want.higher, want.lower, None, None, None, "not measured")
    difference = high.mean - low.mean
    paired = _paired(want, rows)
    if paired is not None:
        return _verdict(want, difference, *paired)
    if high.se is None or low.se is None:
        return Verdict(
            want.higher,
            want.lower,
            difference,
            None,
            None,
            "untested: no standard error with one seed (run with --seeds 2 or more)",
        )
    se = max(math.hypot(high.se, low.se), _seed_differences_se(want, rows) or 0.0)
    return _verdict(want, difference, se, None)


def _verdict(want: Expectation, difference: float, se: float, levels: int | None) -> Verdict:
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
    return Verdict(want.higher, want.lower, difference, se, z, outcome, levels)


def _paired(want: Expectation, rows: dict[str, RowResult]) -> tuple[float, int] | None:
    """(standard error, levels) of the level-by-level comparison of the two sides, where
    every seed of both recorded its levels' outcomes for the same levels: the paired error,
    or the seeds' spread where that is wider."""
    high, low = _seeds_of(want.higher, rows), _seeds_of(want.lower, rows)
    before = [m.levels for m in low if m.levels is not None and m.value is not None]
    after = [m.levels for m in high if m.levels is not None and m.value is not None]
    if len(before) != len(low) or len(after) != len(high):
        return None  # a seed without its levels' outcomes: the sides are compared as means
    change = paired_summaries(before, after)
    if change is None:
        return None
    spread = math.hypot(_spread(high) or 0.0, _spread(low) or 0.0)
    return max(change.se, spread, _seed_differences_se(want, rows) or 0.0), change.levels


def _seed_differences_se(want: Expectation, rows: dict[str, RowResult]) -> float | None:
    """The standard error of the mean of the per-seed differences, where both sides have the
    same seeds, two at least, each with a value; None otherwise."""
    high, low = _by_seed(want.higher, rows), _by_seed(want.lower, rows)
    if high.keys() != low.keys() or len(high) < 2:
        return None
    differences = []
    for seed, value in high.items():
        other = low[seed]
        if value is None or other is None:
            return None
        differences.append(value - other)
    return statistics.stdev(differences) / math.sqrt(len(differences))


def _by_seed(name: str, rows: dict[str, RowResult]) -> dict[int, float | None]:
    """Each seed's value an expectation names, by seed number."""
    run = rows[name.removesuffix(START)]
    return {s.seed: m.value for s, m in zip(run.seeds, _seeds_of(name, rows), strict=True)}


def _spread(measured: Sequence[Measured]) -> float | None:
    """The standard error of the seeds' mean from their spread; None with under two values."""
    values = [m.value for m in measured if m.value is not None]
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) >= 2 else None


def _seeds_of(name: str, rows: dict[str, RowResult]) -> list[Measured]:
    """Each seed's value an expectation names: a run's end, or with @start its start."""
    if name.endswith(START):
        return [s.start for s in rows[name.removesuffix(START)].seeds]
    return [s.end for s in rows[name].seeds]


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


def _moves(actions: Sequence[str]) -> str:
    """An action sequence, short: a repeated unit once with its count (``(Right, Down) × 5``,
    ``Down × 10``), otherwise each run of one action counted (``Right, Down × 3, Left``)."""
    n = len(actions)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and list(actions) == list(actions[:period]) * (n // period):
            unit = ", ".join(actions[:period])
            return f"{unit if period == 1 else f'({unit})'} × {n // period}"
    runs = [(action, len(list(same))) for action, same in groupby(actions)]
    return ", ".join(a if count == 1 else f"{a} × {count}" for a, count in runs)


def _template(m: Measured) -> str:
    if m.template_share is None:
        return "—"
    if m.template:
        return f"{m.template_share:.0%} ({_moves(m.template)})"
    # the most frequent failed play made no move at all (no reply held a valid action)
    return f"{m.template_share:.0%}" + (" (no move)" if m.template_share > 0 else "")


def _seed_lines(rows: Sequence[RowResult]) -> list[str]:
    """Each seed's evaluation before and after training, where the study measured one: the
    change level by level and how much of the play one action sequence took (a run that
    narrows into one sequence has fallen into the Echo Trap, whatever its success)."""
    lines = []
    for row in rows:
        for s in row.seeds:
            if s.change is None and s.end.template_share is None:
                continue
            said = f"- {row.name} seed {s.seed}: {_num(s.start.value)} → {_num(s.end.value)}"
            c = s.change
            if c is not None:
                said += (
                    f", {c.difference:+.3f} ± {c.se:.3f} level by level (z {c.z:+.2f}; "
                    f"{c.gained} of {c.levels} levels gained, {c.lost} lost)"
                )
            said += (
                f"; one action sequence in {_template(s.start)} of the episodes before, "
                f"{_template(s.end)} after"
            )
            if s.spread is not None:
                said += f"; groups whose returns differed: {s.spread:.0%} a step"
            lines.append(said + ".")
    if lines:
        lines[:0] = ["", "Each seed, its evaluation before training against its last one:", ""]
    return lines + _start_lines(rows)


def _start_lines(rows: Sequence[RowResult]) -> list[str]:
    """A line for each seed whose runs' evaluations before training differ: they did not
    start from the same policy under the same settings (a warm start made again on another
    machine, say), so their ends on that seed are not compared from one start."""
    starts: dict[int, dict[float, list[str]]] = {}
    for row in rows:
        for s in row.seeds:
            if s.start.levels is not None and s.start.value is not None:
                starts.setdefault(s.seed, {}).setdefault(s.start.value, []).append(row.name)
    lines = []
    for seed, by_value in sorted(starts.items()):
        if len(by_value) > 1:
            shown = "; ".join(f"{', '.join(names)} {v:.3f}" for v, names in by_value.items())
            lines.append(
                f"- Seed {seed}: the runs' evaluations before training differ ({shown}): they "
                "did not start from the same policy under the same settings."
            )
    return ["", *lines] if lines else []


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
        "| run | preset | seeds | steps | start | end (mean ± SE) | peak | "
        + "".join(f"{c} | " for c in study.columns)
        + "collapsed | first warning | wall time | paper |",
        "|---" * (11 + len(study.columns)) + "|",
    ]
    for row in rows:
        peaks = [s.peak for s in row.seeds if s.peak is not None]
        minutes = sum(s.minutes or 0.0 for s in row.seeds)
        cells = [
            row.name,
            f"`{row.preset}`",
            str(len(row.seeds)),
            ", ".join(str(s.steps) for s in row.seeds),  # a time cap can end a run early
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
            how = "" if v.paired_levels is None else f", level by level on {v.paired_levels} levels"
            said = f"{v.difference:+.3f} ± {v.se:.3f} (z {v.z:+.2f}{how}): {v.outcome}"
        lines.append(f"- Expected {v.higher} above {v.lower}: {said}.")
    lines += _seed_lines(rows)
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
