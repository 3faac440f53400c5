"""The collapse detector against every recorded run whose outcome its success curve shows:
hits, misses and false calls, for the CPU presets' settings, the schema defaults and a grid.

    python -m experiments.detector_calibration [--run RUN_DIR ...] [--out PATH]

The runs: the two recorded Bandit metrics files and the runs read back from report plots in
tests/monitor/data/ (its README.md says how), the stopped Sokoban runs in
experiments/results/runs/, every result JSON that keeps a per-step record
(`experiments.step_record`: learn.py and speedrun.py write one), the studies' RL runs whose
logs are kept in experiments/results/study-*/, and any ``--run`` folder.
Every recorded run played 32 episodes a step (8 groups of 4); a record that does not log
rollout/episodes gets that count, which the detector's counts test reads.

Each run's truth comes from its rollout success alone, as counts of episodes (`label`):

- **collapsed**: for some step c, the success of the W steps before c is above that of all
  the steps from c to the end, by a one-sided exact test whose p-value, times the number of
  steps tried as c, is under 0.01, and the last W steps are still below that level (p under
  0.01): the success fell and stayed down. W is a quarter of the run, at least 2 steps; c is
  the collapse step.
- **learned**: not collapsed, and the last W steps are above the first W (p under 0.05).
- **flat**: neither.

A collapse call on a collapsed run from W steps before its collapse step to 2 steps after it
is a **hit**; a collapsed run without one is a **miss**; every other collapse call on a run
that learned or was flat, and one before that span on a collapsed run, is a **false call**.
Warnings are counted apart: on the runs that did not collapse (where they are not wrong:
a policy that learns narrows too), and on the collapsed ones before the hit (a lead).

Writes ``experiments/results/detector_calibration.json`` (the labels with their reasons; per
setting the tally, and for the named settings each run's calls and warnings) and prints the
table docs/results.md shows. Exact arithmetic on recorded numbers: the same every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments import step_record
from ragen import config
from ragen import metric_names as names
from ragen.config import MonitorConfig
from ragen.monitor.collapse import Alert, replay
from ragen.monitor.counts import fall_p_value
from ragen.run.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
DATA = ROOT / "tests" / "monitor" / "data"
RECORDED_EPISODES = 32  # 8 groups of 4 rollouts in every recorded run
COLLAPSE_ALPHA = 0.01  # the split is chosen by looking: it needs the stronger evidence
LEARNED_ALPHA = 0.05  # one comparison fixed in advance, and no call hangs on it
LATE = 2  # steps after the collapse step a call is still a hit
RULE = {
    "window": "W = max(2, steps // 4)",
    "collapsed": "min over splits c of the exact p (W steps before c vs steps c..end) times the "
    f"splits tried < {COLLAPSE_ALPHA}, and the last W steps below the before level (p < "
    f"{COLLAPSE_ALPHA})",
    "learned": f"not collapsed; last W steps above the first W (p < {LEARNED_ALPHA})",
    "hit": f"a collapse call from W steps before the collapse step to {LATE} after it",
    "false call": "any other collapse call on a run that learned or was flat, or one before "
    "the hit span on a collapsed run",
    "episodes": f"{RECORDED_EPISODES} a step where a record does not log them",
}
BEFORE = MonitorConfig(ema_alpha=0.5, noise_margin=1.0, warmup_steps=3)
"""The CPU overlay's monitor block before this calibration (the ema rule, tuned on Bandit)."""


# ------------------------------------------------------------------------------ runs


@dataclass(frozen=True)
class Run:
    """A recorded run: its metrics.jsonl-like records (with rollout/episodes)."""

    name: str
    preset: str
    source: str
    records: list[dict]


def _with_episodes(records: Sequence[dict], episodes: int) -> list[dict]:
    return [{names.EPISODES: float(episodes), **r} for r in records if "step" in r]


def _relative(path: Path) -> str:
    return (
        str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
    )


def recorded_runs() -> list[Run]:
    """The runs this repository keeps per-step metrics of (see the module docstring)."""
    runs = []
    for path in sorted(DATA.glob("*.jsonl")):
        records = read_jsonl(path).records
        records = _with_episodes(records, RECORDED_EPISODES)
        runs.append(Run(path.stem, "bandit", _relative(path), records))
    digitised = json.loads((DATA / "digitised_runs.json").read_text(encoding="utf-8"))["runs"]
    for name, run in digitised.items():
        records = _with_episodes(run["records"], RECORDED_EPISODES)
        runs.append(Run(name, run["preset"], f"{run['report']} (digitised)", records))
    for folder in sorted((RESULTS / "runs").iterdir()):
        runs.append(folder_run(folder))
    return runs + result_runs() + study_runs()


def study_runs() -> list[Run]:
    """The RL runs of the studies whose logs are kept (``study-*/RUN/seed-K``, as `ragen
    study` lays them out), named by that path; a warm start (an SFT run: no rollout success)
    is not one."""
    runs = []
    for folder in sorted(RESULTS.glob("study-*/*/seed-*")):
        run = folder_run(folder)
        if any(names.SUCCESS in r for r in run.records):
            runs.append(dataclasses.replace(run, name=str(folder.relative_to(RESULTS))))
    return runs


def folder_run(folder: Path) -> Run:
    """A run folder's metrics.jsonl; its episodes per step from rollout/episodes, else from
    its config.yaml (groups x group size)."""
    records = read_jsonl(folder / "metrics.jsonl").records
    data = config.read_yaml(folder / "config.yaml") if (folder / "config.yaml").is_file() else {}
    rollout = data.get("rollout") or {}
    default = config.RolloutConfig()
    episodes = rollout.get("groups", default.groups) * rollout.get("group_size", default.group_size)
    return Run(folder.name, "run", _relative(folder), _with_episodes(records, episodes))


def result_runs() -> list[Run]:
    """Runs whose result JSON keeps a per-step record: learn.py's (``per_step``) and each
    speedrun seed's RL stage (``runs[i].stages.rl.per_step``)."""
    runs = []
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        found = [(path.stem, result.get("preset", ""), result.get("per_step"))]
        for seed in result.get("runs", []) if isinstance(result.get("runs"), list) else []:
            stage = (seed.get("stages") or {}).get("rl") or {}
            name = f"{path.stem}-seed{seed.get('training_seed')}"
            found.append((name, result.get("preset", ""), stage.get("per_step")))
        for name, preset, per_step in found:
            if per_step:
                records = step_record.records_of(per_step)
                runs.append(Run(name, preset, _relative(path), records))
    return runs


# ------------------------------------------------------------------------------ truth


@dataclass(frozen=True)
class Label:
    """A run's truth and the numbers behind it (rates are shares of episodes)."""

    truth: str  # learned, collapsed or flat
    reason: str
    window: int
    collapse_step: int | None = None


def _counts(records: Sequence[dict]) -> list[tuple[int, int]]:
    out = []
    for r in records:
        if names.SUCCESS in r:
            n = round(r[names.EPISODES])
            out.append((round(r[names.SUCCESS] * n), n))
    return out


def _pooled(counts: Sequence[tuple[int, int]]) -> tuple[int, int]:
    return sum(k for k, _ in counts), sum(n for _, n in counts)


def _rate(count: tuple[int, int]) -> str:
    return f"{count[0] / count[1]:.1%} ({count[0]}/{count[1]})"


def label(counts: Sequence[tuple[int, int]]) -> Label:
    """The truth of a run from its rollout success per step, (successes, episodes) per step
    in order (the rule is the module docstring's)."""
    steps = len(counts)
    window = max(2, steps // 4)
    first, last = _pooled(counts[:window]), _pooled(counts[-window:])
    splits = range(1, steps - 1)  # at least two steps after the split
    tried = [
        (fall_p_value(_pooled(counts[max(0, c - window) : c]), _pooled(counts[c:])), c)
        for c in splits
    ]
    if tried:
        p, c = min(tried)
        before, after = _pooled(counts[max(0, c - window) : c]), _pooled(counts[c:])
        stayed = fall_p_value(before, last)
        if p * len(tried) < COLLAPSE_ALPHA and stayed < COLLAPSE_ALPHA:
            reason = (
                f"success {_rate(before)} over steps {max(0, c - window)}-{c - 1}, then "
                f"{_rate(after)} over steps {c}-{steps - 1} (one-sided exact p {p:.2g} x "
                f"{len(tried)} splits < {COLLAPSE_ALPHA}); the last {window} steps "
                f"{_rate(last)} (p {stayed:.2g})"
            )
            return Label("collapsed", reason, window, c)
    rise = fall_p_value(last, first)
    truth = "learned" if rise < LEARNED_ALPHA else "flat"
    reason = (
        f"success {_rate(first)} over the first {window} steps, {_rate(last)} over the last "
        f"(rise p {rise:.2g}); no fall that stayed"
    )
    return Label(truth, reason, window)


# ------------------------------------------------------------------------------ counting


@dataclass(frozen=True)
class Score:
    """What one setting's alerts on one run were (steps)."""

    calls: list[int]
    warnings: list[int]
    hit: int | None  # the first timely call on a collapsed run
    false_calls: list[int]
    lead: int | None  # steps from the first warning before the hit to the hit


def score(truth: Label, alerts: Sequence[Alert]) -> Score:
    """Hit, false calls and lead of ``alerts`` on a run whose truth is ``truth``."""
    calls = [a.step for a in alerts if a.kind == "collapse"]
    warnings = [a.step for a in alerts if a.kind == "warning"]
    c = truth.collapse_step
    if c is None:
        return Score(calls, warnings, None, calls, None)
    timely = [s for s in calls if c - truth.window <= s <= c + LATE]
    hit = timely[0] if timely else None
    ahead = [w for w in warnings if hit is not None and c - 2 * truth.window <= w < hit]
    lead = hit - ahead[0] if hit is not None and ahead else None
    return Score(calls, warnings, hit, [s for s in calls if s < c - truth.window], lead)


def tally(labels: Sequence[Label], scores: Sequence[Score]) -> dict:
    """Hits, misses and false calls of one setting over all runs; warnings apart."""
    collapsed = [(lab, s) for lab, s in zip(labels, scores, strict=True) if lab.collapse_step]
    others = [s for lab, s in zip(labels, scores, strict=True) if lab.collapse_step is None]
    return {
        "collapsed": len(collapsed),
        "hits": sum(s.hit is not None for _, s in collapsed),
        "misses": sum(s.hit is None for _, s in collapsed),
        "false_calls": sum(len(s.false_calls) for s in scores),
        "runs_with_false_calls": sum(bool(s.false_calls) for s in scores),
        "not_collapsed": len(others),
        "warnings_without_collapse": sum(len(s.warnings) for s in others),
        "runs_warned_without_collapse": sum(bool(s.warnings) for s in others),
        "collapses_warned_ahead": sum(s.lead is not None for _, s in collapsed),
    }


def evaluate(runs: Sequence[Run], labels: Sequence[Label], monitor: MonitorConfig) -> tuple:
    """(tally, per-run scores) of ``monitor`` replayed over every run."""
    scores = [
        score(lab, replay(run.records, monitor)) for run, lab in zip(runs, labels, strict=True)
    ]
    return tally(labels, scores), scores


# ------------------------------------------------------------------------------ settings


def named_settings() -> dict[str, MonitorConfig]:
    """The settings every row of the table is read against."""
    return {
        "CPU presets before (ema rule)": BEFORE,
        "CPU presets now": config.load("bandit").monitor,
        "schema defaults": MonitorConfig(),
    }


def grid() -> dict[str, list[MonitorConfig]]:
    """Per family: the ema rule over the settings that move a collapse call, the counts rule
    over its own, and the warnings' shares on the CPU presets' settings."""
    cpu = config.load("bandit").monitor
    return {
        "ema": [
            MonitorConfig(warmup_steps=w, ema_alpha=a, noise_margin=m, reward_drop=d)
            for w, a, m, d in itertools.product(
                [1, 3, 5], [0.3, 0.5, 0.7], [1.0, 2.0, 3.0], [0.3, 0.6, 0.9]
            )
        ],
        "counts": [
            dataclasses.replace(
                BEFORE, success_test="counts", success_window=w, success_z=z, warmup_steps=u
            )
            for w, z, u in itertools.product([1, 2, 3, 4], [3.0, 3.5, 4.0, 4.5], [1, 3])
        ],
        "warnings": [
            dataclasses.replace(cpu, std_drop=d, entropy_drop=d, diversity_drop=d)
            for d in (0.4, 0.6, 0.7)
        ],
    }


def _changed(monitor: MonitorConfig) -> dict:
    """The settings ``monitor`` holds that differ from the schema defaults."""
    default = dataclasses.asdict(MonitorConfig())
    return {k: v for k, v in dataclasses.asdict(monitor).items() if default[k] != v}


def _rank(row: dict) -> tuple:
    t = row["tally"]
    return (
        t["misses"],
        t["false_calls"],
        t["runs_with_false_calls"],
        t["warnings_without_collapse"],
    )


# ------------------------------------------------------------------------------ output


def _line(name: str, t: dict) -> str:
    return (
        f"| {name} | {t['hits']} of {t['collapsed']} | {t['misses']} | {t['false_calls']} "
        f"({t['runs_with_false_calls']} runs) | {t['warnings_without_collapse']} "
        f"({t['runs_warned_without_collapse']} runs) | {t['collapses_warned_ahead']} |"
    )


def table(rows: Sequence[dict]) -> str:
    """The markdown table of ``rows`` (each a name and a tally)."""
    lines = [
        "| settings | hits | misses | false calls | warnings on runs without a collapse "
        "| collapses warned ahead |",
        "|---|---|---|---|---|---|",
    ]
    return "\n".join(lines + [_line(row["name"], row["tally"]) for row in rows])


def shown(named: Sequence[dict], families: dict[str, list[dict]]) -> list[dict]:
    """The table's rows: the named settings, then each grid family's best row, and the
    counts rule's rows one step of success_z either side of the CPU presets'."""
    cpu = _changed(config.load("bandit").monitor)
    rows = list(named)
    for family, ranked in families.items():
        best = ranked[0]
        rows.append({**best, "name": f"best of the {family} grid: {_shown(best['settings'])}"})
    for row in families["counts"]:
        z = row["settings"].get("success_z", MonitorConfig().success_z)
        if row["settings"] == {**cpu, "success_z": z} and z in (3.0, 4.0):
            rows.append({**row, "name": f"CPU presets now with success_z={z}"})
    return rows


def _shown(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "the schema defaults"


def run_table(runs: Sequence[Run], labels: Sequence[Label], named: Sequence[dict]) -> str:
    """Per run: its truth and each named setting's collapse calls (and warnings)."""
    head = " | ".join(row["name"] for row in named)
    lines = [f"| run | steps | truth | {head} |", "|---" * (3 + len(named)) + "|"]
    for run, lab in zip(runs, labels, strict=True):
        cells = []
        for row in named:
            s = row["per_run"][run.name]
            cells.append(f"{s['calls'] or '-'} / {len(s['warnings'])} w")
        truth = lab.truth + (f" (step {lab.collapse_step})" if lab.collapse_step else "")
        lines.append(f"| {run.name} | {len(run.records)} | {truth} | {' | '.join(cells)} |")
    return "\n".join(lines)


def dump(result: dict) -> str:
    """The result as JSON with one line per run and per grid row, so a change to the
    calibration reads as a diff of the lines it moved."""

    def rows(items: Sequence, pad: str) -> str:
        return "[\n" + ",\n".join(pad + json.dumps(i) for i in items) + "\n" + pad[:-1] + "]"

    named = []
    for row in result["named"]:
        head = {k: v for k, v in row.items() if k != "per_run"}
        per_run = ",\n".join(
            f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in row["per_run"].items()
        )
        named.append(json.dumps(head)[:-1] + ', "per_run": {\n' + per_run + "\n  }}")
    grid = ",\n".join(f"  {json.dumps(k)}: {rows(v, '   ')}" for k, v in result["grid"].items())
    return (
        "{\n"
        f' "command": {json.dumps(result["command"])},\n'
        f' "rule": {json.dumps(result["rule"])},\n'
        f' "runs": {rows(result["runs"], "  ")},\n'
        ' "named": [\n  ' + ",\n  ".join(named) + "\n ],\n"
        ' "grid": {\n' + grid + "\n }\n}\n"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, action="append", default=[], help="a run folder too")
    parser.add_argument("--out", type=Path, default=RESULTS / "detector_calibration.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    for folder in args.run:
        if not (folder / "metrics.jsonl").is_file():
            raise SystemExit(f"--run {folder}: no metrics.jsonl there; name a run folder")
    runs = recorded_runs() + [folder_run(f) for f in args.run]
    labels = [label(_counts(run.records)) for run in runs]
    named = []
    for name, monitor in named_settings().items():
        t, scores = evaluate(runs, labels, monitor)
        per_run = {r.name: dataclasses.asdict(s) for r, s in zip(runs, scores, strict=True)}
        named.append({"name": name, "settings": _changed(monitor), "tally": t, "per_run": per_run})
    families = {
        family: sorted(
            ({"settings": _changed(m), "tally": evaluate(runs, labels, m)[0]} for m in monitors),
            key=_rank,
        )
        for family, monitors in grid().items()
    }
    result = {
        "command": "python -m experiments.detector_calibration"
        + "".join(f" --run {f}" for f in args.run),
        "rule": RULE,
        "runs": [
            {"name": r.name, "preset": r.preset, "source": r.source, "steps": len(r.records)}
            | dataclasses.asdict(lab)
            for r, lab in zip(runs, labels, strict=True)
        ],
        "named": named,
        "grid": families,
    }
    args.out.write_text(dump(result), encoding="utf-8")
    print(table(shown(named, families)))
    print()
    print(run_table(runs, labels, named))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
