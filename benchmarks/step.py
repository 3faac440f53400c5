"""Whole training steps of a preset, timed phase by phase; against a baseline commit if asked.

    python -m benchmarks.step [--preset sokoban-rl] [--steps 1] [--threads N] [--repeats 1]
        [--set KEY=VALUE ...] [--baseline COMMIT] [--baseline-set KEY=VALUE ...]
        [--out benchmarks/results/step.json]

Each side builds a fresh Trainer from the preset with the embedded model in a process of its
own and runs ``--steps`` real steps through ``Trainer.step`` (rollout, filter, score,
advantages, update; no evaluation, no checkpoint), from the same seed, so both sides start
from the same weights and play the same first rollout. The current side is this checkout with
``--set``; the baseline side (``benchmarks/baseline.py``) is COMMIT's ragen, checked out into a
temporary git worktree, with ``--set`` and then ``--baseline-set`` (with ``--baseline-set``
alone: this checkout under other settings). With ``--repeats`` above 1 the sides take turns
(baseline first on odd repeats, current first on even), so load from others falls on both.

Phases are the ones the library times (``ragen.phases``), logged as ``time/<phase>_s``:
rollout_env, rollout_prefill, rollout_decode, score, advantages, update_forward,
update_backward, update_optimizer; ``other`` is the rest of the step's wall time (collation,
filtering, metrics, returning freed heap). For each, the FLOPs it needs (``measure.py``;
rollout: the hf generator's work, counted from its token statistics and the episodes) or, for
the optimiser, the bytes it moves, and its share of the machine's matmul peak (in the dtype the
phase computes in: the rollout's weights, the update's autocast) or copy bandwidth, measured
in the same run with the same thread count. ``bound_s`` is the step's
time at those peaks: the FLOPs over the matmul peak plus the optimiser's bytes over the copy
bandwidth.
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
    copy_bandwidth,
    critic_share,
    flops,
    machine,
    matmul_peak,
    model_shape,
    opening_counts,
    positions_sum,
    scored_models,
    update_minis,
)
from ragen import config, phases
from ragen.rollout.trajectory import Trajectory, collate
from ragen.train.forward import shared_prefix_length
from ragen.train.state import RunState
from ragen.train.trainer import Trainer
from ragen.train.update import UpdateData

QUIET = [
    "logging.tensorboard=false",
    "logging.progress=false",
    "logging.save_trajectories=false",
    "monitor.enabled=false",
    "trainer.eval_every=0",
    "trainer.eval_before=false",
    "trainer.save_every=0",
    "trainer.max_minutes=0",
]
ADAMW_BYTES_PER_PARAM = 7 * 4
"""AdamW on float32: reads weight, gradient and both moments, writes weight and moments."""


# ---------------------------------------------------------------------------- work counts


def rollout_counts(trajectories: list[Trajectory], generated: dict) -> dict:
    """What the rollout computed: the generator's token totals and the attention they need.

    Decode: the token at position p attends to p + 1 keys. Prefill: the attention of every
    context (non-sampled) position, scaled by the share the generator actually prefilled (the
    hf generator reuses the shared opening and each episode's earlier turns from its cache).
    """
    context_attn = context_tokens = decode_attn = requests = 0
    for t in trajectories:
        requests += len(t.turns)
        for turn in t.turns:
            decode_attn += positions_sum(turn.reply_start, turn.reply_end)
        sampled = [p for p, m in enumerate(t.loss_mask) if m]
        context_tokens += len(t.token_ids) - len(sampled)
        context_attn += positions_sum(0, len(t.token_ids)) - sum(p + 1 for p in sampled)
    share = generated["prefilled_tokens"] / max(context_tokens, 1)
    return {
        **generated,
        "requests": requests,
        "decode_attn": decode_attn,
        "prefill_attn": round(context_attn * share),
    }


def update_counts(trainer: Trainer, kept: list[Trajectory], step: int) -> dict:
    """Token counts of the scoring pass's micro-batches and the update's, in their order."""
    c, t = trainer.config, trainer.config.trainer
    batch = collate(kept, trainer.m.tokenizer.pad_token_id, c.rollout.reward_placement)
    data = UpdateData(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        loss_mask=batch.loss_mask,
        advantages=None,
        returns=None,
        old_logprobs=None,
        ref_logprobs=None,
        old_values=None,
    )
    parts = []
    for mini_data in update_minis(data, t.ppo_epochs, t.mini_batch_size, t.seed + step):
        ids, mask = mini_data.input_ids, mini_data.attention_mask
        opening = shared_prefix_length(ids, mask)  # run once per mini-batch
        for rows in torch.arange(len(ids)).split(t.micro_batch_size):
            parts.append(chunk_counts(ids[rows], mask[rows], mini_data.loss_mask[rows], opening))
        if opening:
            parts.append(opening_counts(opening))
    update = add_counts(parts)
    score = add_counts(
        [
            chunk_counts(data.input_ids[r], data.attention_mask[r], data.loss_mask[r])
            for r in torch.arange(len(data.input_ids)).split(t.micro_batch_size)
        ]
    )
    return {"update": update, "score": score, "rows": len(kept)}


def phase_work(trainer: Trainer, shape: dict, roll: dict, work: dict | None) -> dict:
    """FLOPs of each phase (bytes for the optimiser) of one step."""
    per_token = 2 * shape["n_body"]
    head = 2 * shape["hidden"] * shape["vocab"]
    attn = 4 * shape["layers"] * shape["attn_width"]
    out = {
        phases.ROLLOUT_PREFILL: per_token * roll["prefilled_tokens"]
        + attn * roll["prefill_attn"]
        + head * roll["requests"],
        phases.ROLLOUT_DECODE: (per_token + head) * roll["generated_tokens"]
        + attn * roll["decode_attn"],
    }
    if work is None:  # the filter kept nothing: no score, no update
        return out
    upd, score = work["update"], work["score"]
    decoders, with_head = scored_models(trainer, work["rows"])
    if decoders:
        out[phases.SCORE] = flops(
            shape,
            score["computed_tokens"],
            score["attn_computed"],
            score["head_positions"] if with_head else 0,
            models_=decoders,
        )

    def update_flops(decoders: float) -> float:
        return flops(
            shape,
            upd["computed_tokens"],
            upd["attn_computed"],
            upd["head_positions"],
            models_=decoders,
        )

    # the critic's values beside the policy's loss, unless it went first on its own
    alone = trainer.critic_first(work["rows"])
    out[phases.UPDATE_FORWARD] = update_flops(1 + critic_share(trainer, beside_policy=not alone))
    out[phases.UPDATE_BACKWARD] = 2 * update_flops(1 + critic_share(trainer, backward=True))
    params = sum(
        p.numel()
        for opt in trainer.m.optimizers.values()
        for group in opt.param_groups
        for p in group["params"]
    )
    out["optimizer_bytes"] = ADAMW_BYTES_PER_PARAM * params
    return out


# ---------------------------------------------------------------------------- running


def run_path(preset: str, overrides: list[str], steps: int, threads: int | None) -> dict:
    """``steps`` steps of a fresh Trainer on ``threads`` torch threads (None: torch's own);
    per step: wall time, phases, work counts. Plain data: a side's process returns it."""
    if threads:
        torch.set_num_threads(threads)
    cfg = config.load(preset, [*QUIET, *overrides])
    trainer = Trainer(cfg)
    state = RunState()
    shape = model_shape(trainer.m.policy)
    records = []
    for step in range(steps):
        before = vars(trainer.generator.stats).copy()
        started = time.perf_counter()
        metrics, _ = trainer.step(step, state)
        wall = time.perf_counter() - started
        after = vars(trainer.generator.stats)
        generated = {k: after[k] - before[k] for k in before if k != "calls"}
        assert trainer.rollouts is not None
        kept, _ = trainer.filter(trainer.rollouts)
        work = update_counts(trainer, kept, step) if kept else None
        roll = rollout_counts(trainer.rollouts, generated)
        spent = {name: metrics[phases.metric(name)] for name in phases.NAMES}
        spent["other"] = wall - sum(spent.values())
        records.append(
            {
                "step": step,
                "wall_s": round(wall, 2),
                "phases_s": {k: round(v, 3) for k, v in spent.items()},
                "work": phase_work(trainer, shape, roll, work),
                "rollout": roll,
                "counts": work,
                "success": metrics["rollout/success"],
                "kept_episodes": len(kept),
            }
        )
        print(f"  step {step}: {wall:.1f} s  {fmt_phases(spent)}", flush=True)
    dtypes = {
        "rollout": dtype_name(next(trainer.sampler.model.parameters()).dtype),
        "update": dtype_name(trainer.update_dtype or torch.float32),
    }
    return {"overrides": overrides, "steps": records, "shape": shape, "dtypes": dtypes}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fmt_phases(spent: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in spent.items() if v >= 0.05)


# ---------------------------------------------------------------------------- report


PEAK_KEYS = {"float32": "fp32_gflops", "bfloat16": "bf16_gflops"}


def summarise(path: dict, peak: dict, bandwidth: float) -> dict:
    """Mean per step of each phase: seconds, work, and its share of the machine's bound (the
    matmul peak of the dtype the phase computes in)."""
    steps = path["steps"]
    names = [*phases.NAMES, "other"]
    table = {}
    bound = 0.0
    for name in names:
        dtype = path["dtypes"]["rollout" if name.startswith("rollout") else "update"]
        gflops = peak[PEAK_KEYS[dtype]]
        seconds = statistics.mean(s["phases_s"][name] for s in steps)
        row: dict = {"seconds": round(seconds, 2)}
        if name == phases.UPDATE_OPTIMIZER:
            moved = statistics.mean(s["work"].get("optimizer_bytes", 0) for s in steps)
            row["gbytes"] = round(moved / 1e9, 2)
            row["bound_s"] = round(moved / 1e9 / bandwidth, 3)
            if seconds > 0:
                row["share_of_bandwidth"] = round(moved / 1e9 / seconds / bandwidth, 3)
        elif any(name in s["work"] for s in steps):
            work = statistics.mean(s["work"].get(name, 0) for s in steps)
            row["dtype"] = dtype
            row["gflop"] = round(work / 1e9, 1)
            row["bound_s"] = round(work / 1e9 / gflops, 2)
            if seconds > 0:
                row["gflop_per_s"] = round(work / 1e9 / seconds, 1)
                row["share_of_peak"] = round(work / 1e9 / seconds / gflops, 3)
        bound += row.get("bound_s", 0.0)
        table[name] = row
    wall = statistics.mean(s["wall_s"] for s in steps)
    return {
        "step_s": round(wall, 2),
        "bound_s": round(bound, 2),
        "wall_over_bound": round(wall / max(bound, 1e-9), 2),
        "dtypes": path["dtypes"],
        "phases": table,
        "rollout_success": [s["success"] for s in steps],
        "kept_episodes": [s["kept_episodes"] for s in steps],
    }


def print_table(summary: dict) -> None:
    """One row per phase: each side's seconds, then the current side's work and its share."""
    names = list(summary)
    print(
        "\n"
        + f"{'phase':<18} "
        + " ".join(f"{name[:8] + ' s':>10}" for name in names)
        + f" {'GFLOP':>10} {'GFLOP/s':>8} {'of peak':>8} {'bound s':>8}"
    )
    current = summary["current"]
    for phase, row in current["phases"].items():
        share = row.get("share_of_peak", row.get("share_of_bandwidth"))
        seconds = " ".join(f"{summary[n]['phases'][phase]['seconds']:>10.1f}" for n in names)
        print(
            f"{phase:<18} {seconds} "
            f"{row.get('gflop', row.get('gbytes', 0)):>10.1f} {row.get('gflop_per_s', 0):>8.1f} "
            f"{'' if share is None else f'{share:.1%}':>8} {row.get('bound_s', 0):>8.2f}"
        )
    steps = " ".join(f"{summary[n]['step_s']:>10.1f}" for n in names)
    print(f"{'step':<18} {steps} {'':>10} {'':>8} {'':>8} {current['bound_s']:>8.2f}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="sokoban-rl")
    parser.add_argument("--steps", type=int, default=1, help="steps per side (mean reported)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side, in turns")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, both sides"
    )
    baseline.add_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/step.json"))
    return parser.parse_args()


def command_line(args: argparse.Namespace) -> str:
    words = ["python -m benchmarks.step", f"--preset {args.preset}", f"--steps {args.steps}"]
    words += [f"--repeats {args.repeats}"] if args.repeats != 1 else []
    words += [f"--threads {args.threads}"] if args.threads else []
    words += [f"--set {s}" for s in args.set] + baseline.command_words(args)
    words += [f"--out {args.out}"]
    return " ".join(words)


def run_sides(args: argparse.Namespace) -> dict[str, dict]:
    """Each side's runs (``--repeats`` in turns), merged: its steps, overrides and dtypes."""
    with baseline.sides(args) as sides:
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        for repeat in range(args.repeats):
            order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
            for name in order:
                src, overrides = sides[name]
                print(f"{name}, repeat {repeat + 1}: {overrides} (ragen: {src})", flush=True)
                runs[name].append(
                    baseline.call(
                        src,
                        "benchmarks.step:run_path",
                        args.preset,
                        overrides,
                        args.steps,
                        args.threads,
                    )
                )
    return {
        name: {
            "steps": [s for r in rs for s in r["steps"]],
            "overrides": rs[0]["overrides"],
            "dtypes": rs[0]["dtypes"],
            "shape": rs[0]["shape"],
        }
        for name, rs in runs.items()
    }


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    commit = baseline.resolve(args.baseline) if args.baseline else None
    merged = run_sides(args)
    shape = merged["current"]["shape"]
    desc = machine(merged["current"]["dtypes"]["rollout"])
    peak = matmul_peak(shape, 1024)
    bandwidth = copy_bandwidth()
    desc["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    summary = {name: summarise(path, peak, bandwidth) for name, path in merged.items()}
    print_table(summary)
    line = (
        f"matmul peak fp32 {peak['fp32_gflops']:.1f}, bf16 {peak['bf16_gflops']:.1f} GFLOP/s "
        f"(rollout in {merged['current']['dtypes']['rollout']}, update in "
        f"{merged['current']['dtypes']['update']}), copy {bandwidth:.1f} GB/s, "
        f"{torch.get_num_threads()} threads"
    )
    report: dict = {
        "command": command_line(args),
        "machine": desc,
        "preset": args.preset,
        "baseline_commit": commit,
        "overrides": {name: path["overrides"] for name, path in merged.items()},
        "seconds": {name: side["step_s"] for name, side in summary.items()},
    }
    if "baseline" in summary:
        speedup = summary["baseline"]["step_s"] / summary["current"]["step_s"]
        report["speedup"] = round(speedup, 2)
        line += f"; speedup {speedup:.2f}x"
    print(line)
    report.update(
        {
            "matmul_peak": peak,
            "copy_gbytes_per_s": bandwidth,
            "model": shape,
            **summary,
            "steps": {name: path["steps"] for name, path in merged.items()},
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
