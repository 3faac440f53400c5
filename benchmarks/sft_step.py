"""Steps of `ragen sft`, the current path against the old one, with their share of the peak.

    python -m benchmarks.sft_step [--preset sokoban] [--steps 2] [--threads N]
        [--set KEY=VALUE ...] [--out benchmarks/results/sft_step.json]

Each path builds a fresh ``SftTrainer`` from the preset with the embedded model and runs
``--steps`` real steps through ``SftTrainer.step`` (the expert's dialogues, then one
supervised update), from the same seed, so both train on the same dialogues from the same
weights. The old path is ``OLD_PATH`` (the forwards in float32, the shared opening run once
per micro-batch: how SFT steps ran before); the current one the preset's own settings
(``trainer.update_dtype=auto``: bf16 autocast where the CPU runs it natively, the opening
once per step). Reported per path: the update's seconds (``time/update_s``), the FLOPs it
needs (forward and backward, counted from the model's shapes and the batch's tokens as the
path computes them, ``measure.py``) and their share of the matmul peak of the dtype it
computes in, measured in the same run with the same thread count; and the losses, which
must agree up to bf16 rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

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

OLD_PATH = ["trainer.update_dtype=float32", "trainer.prefix_sharing=micro_batch"]
QUIET = [
    "sft.steps=1000",  # never the last step here: no final evaluation or checkpoint
    "sft.eval_every=0",
    "trainer.save_every=0",
    "logging.progress=false",
    "logging.tensorboard=false",
]


def step_counts(trainer: SftTrainer, step: int) -> dict:
    """Token counts of ``step``'s update as the trainer's settings compute it: the batch's
    shared opening once per step (prefix_sharing=mini_batch) or once per micro-batch."""
    batch = trainer.batch(trainer.dialogues(step)[0])
    ids, mask, loss = batch.input_ids, batch.attention_mask, batch.loss_mask
    opening = None
    parts = []
    if trainer.config.trainer.prefix_sharing == "mini_batch":
        opening = shared_prefix_length(ids, mask)
        parts.append(opening_counts(opening))
    micro = trainer.config.sft.micro_batch_size
    for start in range(0, len(ids), micro):
        rows = slice(start, start + micro)
        parts.append(chunk_counts(ids[rows], mask[rows], loss[rows], opening))
    return add_counts(parts)


def run_path(preset: str, overrides: list[str], steps: int) -> dict:
    """``steps`` steps of a fresh SftTrainer; per step: update seconds, loss, work."""
    cfg = config.load(preset, [*QUIET, *overrides])
    trainer = SftTrainer(cfg)
    state = RunState()
    shape = model_shape(trainer.m.policy)
    dtype = trainer.update_dtype or torch.float32
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
    gflops = peak["bf16_gflops"] if path["dtype"] == torch.bfloat16 else peak["fp32_gflops"]
    update_s = statistics.mean(s["update_s"] for s in path["steps"])
    work = statistics.mean(s["gflop"] for s in path["steps"])
    return {
        "overrides": path["overrides"],
        "dtype": str(path["dtype"]).removeprefix("torch."),
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
    parser.add_argument("--preset", default="sokoban")
    parser.add_argument("--steps", type=int, default=2, help="steps per path (mean reported)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, both paths"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sft_step.json"))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = {"old": [*args.set, *OLD_PATH], "new": args.set}
    runs = {}
    for name, overrides in paths.items():
        print(f"{name} path: {overrides}", flush=True)
        runs[name] = run_path(args.preset, overrides, args.steps)
    shape = runs["new"]["shape"]
    desc = machine(runs["new"]["dtype"])
    peak = matmul_peak(shape, 1024)
    desc["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    summary = {name: summarise(path, peak) for name, path in runs.items()}
    old, new = summary["old"], summary["new"]
    print(f"\n{'path':<5} {'dtype':>9} {'update s':>9} {'GFLOP':>8} {'of peak':>8} {'bound s':>8}")
    for name, row in summary.items():
        print(
            f"{name:<5} {row['dtype']:>9} {row['update_s']:>9.1f} {row['gflop']:>8.0f} "
            f"{row['share_of_peak']:>8.1%} {row['bound_s']:>8.2f}"
        )
    speedup = old["update_s"] / new["update_s"]
    print(
        f"matmul peak fp32 {peak['fp32_gflops']:.1f}, bf16 {peak['bf16_gflops']:.1f} GFLOP/s, "
        f"{torch.get_num_threads()} threads; update {speedup:.2f}x faster; "
        f"losses old {old['losses']} new {new['losses']}"
    )
    words = ["python -m benchmarks.sft_step", f"--preset {args.preset}", f"--steps {args.steps}"]
    words += [f"--threads {args.threads}"] if args.threads else []
    words += [f"--set {s}" for s in args.set] + [f"--out {args.out}"]
    report = {
        "command": " ".join(words),
        "machine": desc,
        "preset": args.preset,
        "old_s": old["update_s"],
        "new_s": new["update_s"],
        "speedup": round(speedup, 2),
        "matmul_peak": peak,
        "model": shape,
        "old": old,
        "new": new,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
