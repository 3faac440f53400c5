"""A training run's compact per-step record, kept in its result JSON so that the collapse
detector can be calibrated on it after the run folder is gone (`detector_calibration`).

The record holds, per step, what the detector reads and what a run's truth is read from:
rollout success and its episode count, reward mean and std, token entropy, gradient norm,
the diversity signals and the MI estimate, the evaluation success where one ran; and the
alerts the run's detector raised, with the monitor settings it ran with. Columns of numbers
rounded to 4 significant digits, None where a step logged nothing: a few KB for 40 steps.
"""

from __future__ import annotations

from pathlib import Path

from ragen import metric_names as names
from ragen.config import read_yaml
from ragen.monitor.collapse import is_finite_number
from ragen.run.jsonl import read_jsonl

KEYS = (
    names.SUCCESS,
    names.EPISODES,
    names.REWARD_MEAN,
    names.REWARD_STD,
    names.ENTROPY,
    names.GRAD_NORM,
    names.DISTINCT_REPLY,
    names.DISTINCT_THINK,
    names.ACTION_TEMPLATE_SHARE,
    names.MI,
)


def _round(value: object) -> float | None:
    return float(f"{value:.4g}") if is_finite_number(value) else None


def record(run_dir: Path) -> dict | None:
    """The per-step record of the run in ``run_dir`` (its metrics.jsonl, alerts.jsonl and
    config.yaml), or None when it logged no step."""
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl").records if "step" in r]
    if not rows:
        return None
    evals = sorted({k for r in rows for k in r if k.startswith("eval/") and k.endswith("/success")})
    columns = {"step": [int(r["step"]) for r in rows]}
    for key in (*KEYS, *evals):
        if any(key in r for r in rows):
            columns[key] = [_round(r.get(key)) for r in rows]
    alerts = [
        [a["step"], a["kind"], a["signal"]]
        for a in read_jsonl(run_dir / "alerts.jsonl").records
        if {"step", "kind", "signal"} <= a.keys()
    ]
    config = run_dir / "config.yaml"
    monitor = read_yaml(config).get("monitor") if config.is_file() else None
    return {"columns": columns, "alerts": alerts, "monitor": monitor}


def records_of(per_step: dict) -> list[dict]:
    """A per-step record back as metrics.jsonl-like records (what `replay` reads)."""
    columns = per_step["columns"]
    return [
        {key: values[i] for key, values in columns.items() if values[i] is not None}
        for i in range(len(columns["step"]))
    ]
