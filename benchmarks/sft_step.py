"""Steps of `ragen sft` with their share of the peak; against a baseline commit if asked.

    python -m benchmarks.sft_step [--preset sokoban-rl] [--steps 2] [--threads N]
        [--set KEY=VALUE ...] [--baseline COMMIT] [--baseline-set KEY=VALUE ...]
        [--out benchmarks/results/sft_step.json]

Each side builds a fresh ``SftTrainer`` from the preset with the embedded model in a process
of its own and runs ``--steps`` real steps through ``SftTrainer.step`` (the expert's
dialogues, then one supervised update), from the same seed, so both sides train on the same
dialogues from the same weights. The current side is this checkout with ``--set``; the
baseline side (``benchmarks/baseline.py``) is COMMIT's ragen, checked out into a temporary
git worktree, with ``--set`` and then ``--baseline-set`` (with ``--baseline-set`` alone: this
checkout under other settings, e.g. ``trainer.update_dtype=float32``). Reported per side: the
update's seconds (``time/update_s``), the FLOPs it needs (forward and backward, counted from
the model's shapes and the batch's tokens as the current code computes them, the opening once
per step, ``measure.py``) and their share of the matmul peak of the dtype it computes in,
measured in the same run with the same thread count; and the losses, which must agree up to
bf16 rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks import baseline
from benchmarks.measure import (
    add_counts,
    chunk_counts,
    flops,
    machine,
    matmul_peak,
    model_shape,
    opening_counts,
)
from ragen import config, metric_names
from ragen.train.forward import shared_prefix_length
from ragen.train.sft import SftTrainer
from ragen.train.state import RunState

QUIET = [
    "sft.steps=1000",  # never the last step here: no final evaluation or checkpoint
    "sft.eval_every=0",
    "trainer.save_every=0",
    "logging.progress=false",
    "logging.tensorboard=false",
]


def step_counts(trainer: SftTrainer, step: int) -> dict:
    """Token counts of ``step``'s update as ragen computes it: the batch's shared opening once
    per step, then each micro-batch's rows after it."""
    batch = trainer.batch(trainer.dialogues(step)[0])
    ids, mask, loss = batch.input_ids, batch.attention_mask, batch.loss_mask
    opening = shared_prefix_length(ids, mask)
    parts = [opening_counts(opening)]
    micro = trainer.config.sft.micro_batch_size
    for start in range(0, len(ids), micro):
        rows = slice(start, start + micro)
        parts.append(chunk_counts(ids[rows], mask[rows], loss[rows], opening))
    return add_counts(parts)


def run_path(preset: str, overrides: list[str], steps: int, threads: int | None) -> dict:
    """``steps`` steps of a fresh SftTrainer on ``threads`` torch threads (None: torch's own);
    per step: update seconds, loss, work. Plain data: a side's process returns it."""
    if threads:
        torch.set_num_threads(threads)
    cfg = config.load(preset, [*QUIET, *overrides])
    trainer = SftTrainer(cfg)
    state = RunState()
    shape = model_shape(trainer.m.policy)
    dtype = str(trainer.update_dtype or torch.float32).removeprefix("torch.")
    records = []
    for step in range(steps):
        counts = step_counts(trainer, step)
        started = time.perf_counter()
        metrics, _ = trainer.step(step, state)
        wall = time.perf_counter() - started
        # forward and backward (twice the forward) of one decoder and its LM head
        work = 3 * flops(
            shape,
            counts["computed_tokens"],
            counts["attn_computed"],
            counts["head_positions"],
            models_=1,
        )
        records.append(
            {
                "step": step,
                "wall_s": round(wall, 2),
                "update_s": round(metrics["time/update_s"], 2),
                "loss": metrics[metric_names.SFT_LOSS],
                "gflop": round(work / 1e9, 1),
                "counts": counts,
            }
        )
        print(
            f"  step {step}: update {records[-1]['update_s']:.1f} s, "
            f"loss {records[-1]['loss']:.4f}, {records[-1]['gflop']:.0f} GFLOP",
            flush=True,
        )
    return {"overrides": overrides, "dtype": dtype, "shape": shape, "steps": records}


def summarise(path: dict, peak: dict) -> dict:
    gflops = peak["bf16_gflops"] if path["dtype"] == "bfloat16" else peak["fp32_gflops"]
    update_s = statistics.mean(s["update_s"] for s in path["steps"])
    work = statistics.mean(s["gflop"] for s in path["steps"])
    return {
        "overrides": path["overrides"],
        "dtype": path["dtype"],
        "update_s": round(update_s, 2),
        "step_s": round(statistics.mean(s["wall_s"] for s in path["steps"]), 2),
        "gflop": round(work, 1),
        "gflop_per_s": round(work / update_s, 1),
        "share_of_peak": round(work / update_s / gflops, 3),
        "bound_s": round(work / gflops, 2),
        "losses": [s["loss"] for s in path["steps"]],
        "steps": path["steps"],
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="sokoban-rl")
    parser.add_argument("--steps", type=int, default=2, help="steps per side (mean reported)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, both sides"
    )
    baseline.add_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sft_step.json"))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    commit = baseline.resolve(args.baseline) if args.baseline else None
    runs = {}
    with baseline.sides(args) as sides:
        for name, (src, overrides) in sides.items():
            print(f"{name}: {overrides} (ragen: {src})", flush=True)
            runs[name] = baseline.call(
                src,
                "benchmarks.sft_step:run_path",
                args.preset,
                overrides,
                args.steps,
                args.threads,
            )
    shape = runs["current"]["shape"]
    desc = machine(runs["current"]["dtype"])
    peak = matmul_peak(shape, 1024)
    desc["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    summary = {name: summarise(path, peak) for name, path in runs.items()}
    print(f"\n{'side':<9} {'dtype':>9} {'update s':>9} {'GFLOP':>8} {'of peak':>8} {'bound s':>8}")
    for name, row in summary.items():
        print(
            f"{name:<9} {row['dtype']:>9} {row['update_s']:>9.1f} {row['gflop']:>8.0f} "
            f"{row['share_of_peak']:>8.1%} {row['bound_s']:>8.2f}"
        )
    line = (
        f"matmul peak fp32 {peak['fp32_gflops']:.1f}, bf16 {peak['bf16_gflops']:.1f} GFLOP/s, "
        f"{torch.get_num_threads()} threads; losses "
        + ", ".join(f"{name} {row['losses']}" for name, row in summary.items())
    )
    words = ["python -m benchmarks.sft_step", f"--preset {args.preset}", f"--steps {args.steps}"]
    words += [f"--threads {args.threads}"] if args.threads else []
    words += [f"--set {s}" for s in args.set] + baseline.command_words(args)
    words += [f"--out {args.out}"]
    report: dict = {
        "command": " ".join(words),
        "machine": desc,
        "preset": args.preset,
        "baseline_commit": commit,
        "seconds": {name: row["update_s"] for name, row in summary.items()},
    }
    if "baseline" in summary:
        speedup = summary["baseline"]["update_s"] / summary["current"]["update_s"]
        report["speedup"] = round(speedup, 2)
        line += f"; update {speedup:.2f}x faster"
    print(line)
    report.update({"matmul_peak": peak, "model": shape, **summary})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
