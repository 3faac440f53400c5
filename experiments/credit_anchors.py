"""What GiGPO's per-turn credit had to compare in recorded runs: the ``gigpo/…`` metrics
(``ragen.monitor.metrics.credit_metrics``) of every step's kept episodes, read back from the
runs' trajectories.

    python -m experiments.credit_anchors RUN_DIR [RUN_DIR ...] [--name NAME]

Each run's steps are replayed from ``trajectories/step_*.jsonl`` through the run's own
filter (its config.yaml), and their anchor groups and GiGPO terms computed with the gigpo
settings of that config (a run of another estimator: the algo's gigpo defaults, i.e. what
GiGPO would have credited on those rollouts). Prints one row a run (the means over its
steps) and writes ``experiments/results/credit_anchors[_NAME].json``. Exact: the same on
every machine. Runs from before a run logged these metrics get them here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ragen import config
from ragen import metric_names as names
from ragen.algos.filtering import METRICS
from ragen.monitor.metrics import credit_metrics
from ragen.rollout.trajectory import Trajectory, Turn
from ragen.train.trainer import filter_episodes

RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = (
    names.GIGPO_ANCHORED_SHARE,
    names.GIGPO_TURNS_PER_ANCHOR,
    names.GIGPO_EPISODE_ADV,
    names.GIGPO_STEP_ADV,
)


def episode(record: dict) -> Trajectory:
    """A recorded episode as a Trajectory of turns (no token ids: the records keep none)."""
    turns = [Turn(**turn, reply_start=0, reply_end=0) for turn in record["turns"]]
    return Trajectory(
        env=record["env"],
        group=record["group"],
        copy=record["copy"],
        seed=record["seed"],
        turns=turns,
        success=record["success"],
        end=record["end"],
    )


def run_steps(run: Path) -> list[dict[str, float]]:
    """The ``gigpo/…`` metrics of each recorded step of ``run``, in step order."""
    c = config.load(str(run / "config.yaml"))
    if METRICS[c.algo.filter_metric][0] != "return":
        raise SystemExit(
            f"{run}: its filter reads {c.algo.filter_metric}, which the trajectory records "
            "do not hold; only filters on returns replay"
        )
    a, steps = c.algo, []
    for path in sorted((run / "trajectories").glob("step_*.jsonl")):
        with path.open() as f:
            played = [episode(json.loads(line)) for line in f if line.strip()]
        kept, _ = filter_episodes(played, c)  # rollbacks are not in the records: none
        steps.append(
            credit_metrics(
                kept,
                gamma=a.gigpo_gamma,
                step_weight=a.gigpo_step_weight,
                norm_by_std=a.gigpo_mode == "mean_std_norm",
                similarity=a.gigpo_similarity,
            )
        )
    return steps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories with trajectories/")
    p.add_argument("--name", default="", help="suffix of the JSON file's name")
    args = p.parse_args(argv)
    rows = {}
    print(
        f"{'run':<40} {'steps':>5} {'anchored':>8} {'turns/anchor':>12} {'|A_E|':>6} {'w|A_S|':>6}"
    )
    for run in args.runs:
        if not (run / "trajectories").is_dir() or not (run / "config.yaml").is_file():
            sys.exit(f"{run}: not a run directory with config.yaml and trajectories/")
        steps = [s for s in run_steps(run) if s]
        if not steps:
            sys.exit(f"{run}: no recorded step with a kept episode")
        means = {k: statistics.mean(s[k] for s in steps) for k in COLUMNS}
        rows[str(run)] = {"steps": steps, "mean": means}
        print(
            f"{str(run)[-40:]:<40} {len(steps):>5} {means[COLUMNS[0]]:>8.1%} "
            f"{means[COLUMNS[1]]:>12.2f} {means[COLUMNS[2]]:>6.3f} {means[COLUMNS[3]]:>6.3f}"
        )
    out = RESULTS / f"credit_anchors{'_' + args.name if args.name else ''}.json"
    out.write_text(json.dumps({"command": sys.argv, "runs": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
