"""Whole training steps of a preset, timed phase by phase: the current path against the old one.

    python -m benchmarks.step [--preset sokoban] [--steps 1] [--threads N] [--repeats 1]
        [--set KEY=VALUE ...] [--old-set KEY=VALUE ...] [--out benchmarks/results/step.json]

Each path builds a fresh Trainer from the preset with the embedded model and runs ``--steps``
real steps through ``Trainer.step`` (rollout, filter, score, advantages, update; no evaluation,
no checkpoint), from the same seed, so both start from the same weights and play the same
first rollout. The old path is the same preset with ``OLD_PATH`` added (the code path and
settings steps took before they were made cheaper, each still selectable by config) and
``--old-set`` after it. With ``--repeats`` above 1 the paths take turns (old first on odd
repeats, new first on even), so load from others falls on both.

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

OLD_PATH = [
    "trainer.scoring_pass=always",
    "trainer.prefix_sharing=micro_batch",
    "model.dtype=float32",
    "trainer.sort_micro_batches=false",
    "model.attention=sdpa",
]
"""Overrides that restore how a step ran before issue 19: a scoring pass before every update,
the shared opening run again by every micro-batch, rollouts sampled from the float32 master
weights (model.dtype was read by ragen eval only), micro-batches cut in random order, decoding
with transformers' own attention."""
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
    once = t.prefix_sharing == "mini_batch"  # the opening once per mini-batch
    parts = []
    for mini_data in update_minis(
        data, t.ppo_epochs, t.mini_batch_size, t.seed + step, t.sort_micro_batches
    ):
        ids, mask = mini_data.input_ids, mini_data.attention_mask
        opening = shared_prefix_length(ids, mask) if once else None
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


def run_path(preset: str, overrides: list[str], steps: int) -> dict:
    """``steps`` steps of a fresh Trainer; per step: wall time, phases, work counts."""
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
        "rollout": next(trainer.sampler.model.parameters()).dtype,
        "update": trainer.update_dtype or torch.float32,
    }
    return {"overrides": overrides, "steps": records, "shape": shape, "dtypes": dtypes}


def fmt_phases(spent: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in spent.items() if v >= 0.05)


# ---------------------------------------------------------------------------- report


PEAK_KEYS = {torch.float32: "fp32_gflops", torch.bfloat16: "bf16_gflops"}


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
            row["dtype"] = str(dtype).removeprefix("torch.")
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
        "dtypes": {k: str(v).removeprefix("torch.") for k, v in path["dtypes"].items()},
        "phases": table,
        "rollout_success": [s["success"] for s in steps],
        "kept_episodes": [s["kept_episodes"] for s in steps],
    }


def print_table(old: dict, new: dict) -> None:
    print(
        f"\n{'phase':<18} {'old s':>8} {'new s':>8} {'new GFLOP':>10} {'GFLOP/s':>8} "
        f"{'of peak':>8} {'bound s':>8}"
    )
    for name, row in new["phases"].items():
        share = row.get("share_of_peak", row.get("share_of_bandwidth"))
        print(
            f"{name:<18} {old['phases'][name]['seconds']:>8.1f} {row['seconds']:>8.1f} "
            f"{row.get('gflop', row.get('gbytes', 0)):>10.1f} {row.get('gflop_per_s', 0):>8.1f} "
            f"{'' if share is None else f'{share:.1%}':>8} {row.get('bound_s', 0):>8.2f}"
        )
    print(
        f"{'step':<18} {old['step_s']:>8.1f} {new['step_s']:>8.1f} {'':>10} {'':>8} {'':>8} "
        f"{new['bound_s']:>8.2f}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="sokoban")
    parser.add_argument("--steps", type=int, default=1, help="steps per path (mean reported)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each path, in turns")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own)"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, both paths"
    )
    parser.add_argument(
        "--old-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override for the old path, after OLD_PATH",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/step.json"))
    return parser.parse_args()


def command_line(args: argparse.Namespace) -> str:
    words = ["python -m benchmarks.step", f"--preset {args.preset}", f"--steps {args.steps}"]
    words += [f"--repeats {args.repeats}"] if args.repeats != 1 else []
    words += [f"--threads {args.threads}"] if args.threads else []
    words += [f"--set {s}" for s in args.set] + [f"--old-set {s}" for s in args.old_set]
    words += [f"--out {args.out}"]
    return " ".join(words)


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = {"old": [*args.set, *OLD_PATH, *args.old_set], "new": args.set}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for repeat in range(args.repeats):
        order = ("old", "new") if repeat % 2 == 0 else ("new", "old")
        for name in order:
            print(f"{name} path, repeat {repeat + 1}: {paths[name]}", flush=True)
            runs[name].append(run_path(args.preset, paths[name], args.steps))
    shape = runs["new"][0]["shape"]
    desc = machine(runs["new"][0]["dtypes"]["rollout"])
    peak = matmul_peak(shape, 1024)
    bandwidth = copy_bandwidth()
    desc["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    merged = {
        name: {
            "steps": [s for r in rs for s in r["steps"]],
            "overrides": rs[0]["overrides"],
            "dtypes": rs[0]["dtypes"],
        }
        for name, rs in runs.items()
    }
    summary = {name: summarise(path, peak, bandwidth) for name, path in merged.items()}
    old_s, new_s = summary["old"]["step_s"], summary["new"]["step_s"]
    print_table(summary["old"], summary["new"])
    print(
        f"matmul peak fp32 {peak['fp32_gflops']:.1f}, bf16 {peak['bf16_gflops']:.1f} GFLOP/s "
        f"(rollout in {merged['new']['dtypes']['rollout']}, update in "
        f"{merged['new']['dtypes']['update']}), copy {bandwidth:.1f} GB/s, "
        f"{torch.get_num_threads()} threads; speedup {old_s / new_s:.2f}x"
    )
    report = {
        "command": command_line(args),
        "machine": desc,
        "preset": args.preset,
        "old_path": merged["old"]["overrides"],
        "new_path": merged["new"]["overrides"],
        "old_s": old_s,
        "new_s": new_s,
        "speedup": round(old_s / new_s, 2),
        "matmul_peak": peak,
        "copy_gbytes_per_s": bandwidth,
        "model": shape,
        "old": summary["old"],
        "new": summary["new"],
        "steps": {name: path["steps"] for name, path in merged.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
