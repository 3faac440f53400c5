"""Threads that follow the machine: a run beside another job, with and without the follower.

    python -m benchmarks.threads [--steps 6] [--switch-after 2]
        [--out benchmarks/results/threads.json]

Each case is one `ragen train bandit` run (the preset, ``--steps`` steps, no evaluation),
with a second process that spins one core (the other job) for part of it:

- ``job starts``: the machine quiet at the start, the job started once step ``--switch-after``
  is logged; the run pinned at 2 threads (``trainer.threads=2``: how a run that started
  quiet went on before the follower) against the default (``trainer.threads=0``: it follows);
- ``job ends``: the job running at the start, stopped once step ``--switch-after`` is logged;
  the run pinned at 1 thread (how a run that started beside a job went on) against the
  default;
- ``quiet, 1 thread`` and ``quiet, 2 threads``: no job; their metrics must be equal, bit for
  bit, apart from times (the follower changes the count mid-run only because a run's numbers
  do not depend on it on this machine).

Per case: the seconds of each step after the switch, their sum, and ``perf/threads`` per
step; the ratio pinned / following for the two job cases. Run it on a quiet machine: the
job is the only load it should meet.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.measure import machine, write_summary

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True: pass"
POLL_S = 0.5


def _steps_logged(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def run_case(out: Path, threads: int, steps: int, job: str, switch_after: int) -> list[dict]:
    """Train ``steps`` steps with ``trainer.threads=threads``; ``job`` is "none", "starts"
    (after step ``switch_after`` is logged) or "ends" (then). Returns the metrics records."""
    command = [
        sys.executable, "-m", "ragen", "train", "bandit", f"trainer.steps={steps}",
        "trainer.eval_every=0", "trainer.save_every=0", "logging.progress=false",
        f"trainer.threads={threads}", "--out", str(out),
    ]  # fmt: skip
    spinner = subprocess.Popen([sys.executable, "-c", SPIN]) if job == "ends" else None
    if spinner is not None:
        time.sleep(2.0)  # the job holds its core when the run samples the machine
    trainer = subprocess.Popen(command, cwd=ROOT)
    try:
        while trainer.poll() is None:
            if job != "none" and _steps_logged(out) >= switch_after:
                if job == "starts" and spinner is None:
                    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
                elif job == "ends" and spinner is not None:
                    spinner.kill()
                    spinner = None
            time.sleep(POLL_S)
    finally:
        if spinner is not None:
            spinner.kill()
    if trainer.returncode:
        sys.exit(f"the run in {out} ended with exit status {trainer.returncode}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _step_seconds(record: dict) -> float:
    return record["time/rollout_s"] + record.get("time/update_s", 0.0)


def _numbers(records: list[dict]) -> list[dict]:
    """The records without what depends on time or the thread count."""
    return [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--switch-after", type=int, default=2, help="steps logged before")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/threads.json")
    args = parser.parse_args()
    cases = {
        "job starts, pinned at 2 threads": (2, "starts"),
        "job starts, following": (0, "starts"),
        "job ends, pinned at 1 thread": (1, "ends"),
        "job ends, following": (0, "ends"),
        "quiet, 1 thread": (1, "none"),
        "quiet, 2 threads": (2, "none"),
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (threads, job)) in enumerate(cases.items()):
            records = run_case(Path(tmp) / str(i), threads, args.steps, job, args.switch_after)
            after = records[args.switch_after :]
            results[name] = {
                "trainer_threads": threads,
                "job": job,
                "step_s": [round(_step_seconds(r), 2) for r in records],
                "threads_per_step": [int(r["perf/threads"]) for r in records],
                "after_switch_s": round(sum(_step_seconds(r) for r in after), 2),
                "numbers": _numbers(records),
            }
            row = results[name]
            print(f"{name:34s} threads {row['threads_per_step']} steps {row['step_s']}", flush=True)
    same = results["quiet, 1 thread"]["numbers"] == results["quiet, 2 threads"]["numbers"]
    ratios = {
        "job starts: pinned 2 / following": results["job starts, pinned at 2 threads"][
            "after_switch_s"
        ]
        / results["job starts, following"]["after_switch_s"],
        "job ends: pinned 1 / following": results["job ends, pinned at 1 thread"]["after_switch_s"]
        / results["job ends, following"]["after_switch_s"],
    }
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x (steps after the switch)")
    print(f"quiet runs at 1 and 2 threads give the same numbers: {same}")
    for row in results.values():
        del row["numbers"]
    write_summary(
        args.out,
        {
            "command": "python -m benchmarks.threads " + " ".join(sys.argv[1:]),
            "machine": machine(torch.float32),
            "steps": args.steps,
            "switch_after": args.switch_after,
            "cases": results,
            "ratios": {k: round(v, 3) for k, v in ratios.items()},
            "same_numbers_at_1_and_2_threads": same,
        },
    )


if __name__ == "__main__":
    main()
