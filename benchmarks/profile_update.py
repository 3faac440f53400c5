"""Where an update's time goes, op by op: one real PPO update under ``torch.profiler``.

    python -m benchmarks.profile_update [--preset sokoban-rl] [--set KEY=VALUE ...]
        [--threads 2] [--top 25] [--by-shape] [--out benchmarks/results/profile_update.json]

The batch is real: the Trainer's own stages collect one rollout of the preset with the
embedded model, filter and score it (as ``update.py`` does). The update then runs twice: once
unprofiled (its wall time, and warm caches), once under the profiler. Each op's *self* time
(its own kernels, not the ops it calls) is summed by name and by kind:

- ``matmul``: GEMMs (mm, addmm, bmm, the oneDNN linear kernels), the work FLOP counts measure;
- ``attention``: scaled-dot-product attention and its backward;
- ``cast/copy``: dtype casts, copies, clones, cat, gathers, fills and allocations, where
  bytes move and nothing is computed;
- ``elementwise``: adds, muls, activations, norms, reductions and the loss's softmax;
- ``optimizer``: the AdamW steps and gradient clipping (foreach kernels);
- ``autograd``: the engine's own bookkeeping between kernels;
- ``other``: the rest.

The table prints each kind's seconds and share of the profiled update, the top ops by self
time (with ``--by-shape``, also split by their input shapes), and the bf16 and fp32 matmul
peaks measured in the same run, so the gap between what the GEMMs need and what the update
takes is split into named parts. Single-tensor AdamW's ``lerp_``, ``sqrt`` and ``addcdiv_``
are counted by name, under other and elementwise, not under optimizer.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.measure import matmul_peak, model_shape, write_summary
from benchmarks.update import collected

KINDS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn", "onednn"),
    "attention": ("scaled_dot_product", "flash_attention", "efficient_attention"),
    "cast/copy": (
        "aten::copy_",
        "aten::_to_copy",
        "aten::to",
        "aten::clone",
        "aten::contiguous",
        "aten::cat",
        "aten::index",
        "aten::gather",
        "aten::scatter",
        "aten::fill_",
        "aten::zero_",
        "aten::empty",
    ),
    "optimizer": ("_foreach", "adam", "Optimizer", "clip_grad", "aten::_fused"),
    "autograd": ("autograd::engine", "torch::autograd", "AccumulateGrad"),
}
ELEMENTWISE = (
    "aten::add",
    "aten::mul",
    "aten::sub",
    "aten::div",
    "aten::neg",
    "aten::silu",
    "aten::pow",
    "aten::rsqrt",
    "aten::mean",
    "aten::sum",
    "aten::exp",
    "aten::log",
    "aten::softmax",
    "aten::_softmax",
    "aten::log_softmax",
    "aten::_log_softmax",
    "aten::logsumexp",
    "aten::clamp",
    "aten::where",
    "aten::maximum",
    "aten::minimum",
    "aten::embedding",
    "aten::threshold",
    "aten::sigmoid",
    "aten::masked_fill",
)


def kind_of(name: str) -> str:
    """The kind an op's time belongs to (see the module docstring); backward ops (named
    ``XBackward0`` by autograd) go with their forward's kind through the kernels they call,
    so only their own bookkeeping is ``autograd``."""
    for kind, needles in KINDS.items():
        if any(n in name for n in needles):
            return kind
    if name.startswith(ELEMENTWISE):
        return "elementwise"
    if "Backward" in name:
        return "autograd"
    return "other"


def op_table(prof, by_shape: bool = False) -> list[dict]:
    """Per op name (and, with ``by_shape``, per list of input shapes: which tensors an op
    spends its time on, e.g. the LM head's (positions, vocab) logits against one layer's
    (rows, tokens, hidden) activations): calls and self CPU seconds, largest first."""
    rows = [
        {"op": e.key, "calls": e.count, "self_s": e.self_cpu_time_total / 1e6}
        | ({"shapes": str(e.input_shapes)} if by_shape else {})
        for e in prof.key_averages(group_by_input_shape=by_shape)
    ]
    return sorted(rows, key=lambda r: -r["self_s"])


def by_kind(ops: list[dict]) -> dict[str, float]:
    kinds: dict[str, float] = defaultdict(float)
    for r in ops:
        kinds[kind_of(r["op"])] += r["self_s"]
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="sokoban-rl")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--top", type=int, default=25, help="ops listed by self time")
    parser.add_argument(
        "--by-shape",
        action="store_true",
        help="also list the top ops split by their input shapes (records shapes: slower)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/profile_update.json"))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    with collected(args.preset, args.set) as (trainer, desc, kept, batch):
        data = trainer.prepare(kept)
        # the unprofiled update changes the weights; the profiled one then sees the same
        # shapes, which is all its op times depend on
        started = time.perf_counter()
        trainer.update(data, 0)
        plain_s = time.perf_counter() - started
        with profile(activities=[ProfilerActivity.CPU], record_shapes=args.by_shape) as prof:
            started = time.perf_counter()
            trainer.update(data, 1)
            profiled_s = time.perf_counter() - started
        shape = model_shape(trainer.m.policy)
    ops = op_table(prof)
    shaped = op_table(prof, by_shape=True)[: args.top] if args.by_shape else []
    kinds = by_kind(ops)
    total = sum(kinds.values())
    peak = matmul_peak(shape, 1024)
    print(f"\nupdate: {plain_s:.1f} s unprofiled, {profiled_s:.1f} s profiled")
    print(f"\n{'kind':<12} {'self s':>8} {'share':>7}")
    for kind, seconds in kinds.items():
        print(f"{kind:<12} {seconds:>8.2f} {seconds / total:>7.1%}")
    print(f"\n{'op':<52} {'calls':>7} {'self s':>8} {'share':>7}  kind")
    for r in ops[: args.top]:
        print(
            f"{r['op'][:52]:<52} {r['calls']:>7} {r['self_s']:>8.2f} "
            f"{r['self_s'] / total:>7.1%}  {kind_of(r['op'])}"
        )
    for r in shaped:
        print(f"{r['op'][:30]:<30} {r['calls']:>6} {r['self_s']:>7.2f}  {r['shapes'][:80]}")
    print(
        f"\nmatmul peak in this run: bf16 {peak['bf16_gflops']:.0f} GFLOP/s, "
        f"fp32 {peak['fp32_gflops']:.0f} GFLOP/s"
    )
    desc["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    write_summary(
        args.out,
        {
            "command": "python -m benchmarks.profile_update --preset "
            + args.preset
            + f" --threads {args.threads}"
            + (" --by-shape" if args.by_shape else "")
            + "".join(f" --set {s}" for s in args.set),
            "machine": desc,
            "rollout": batch,
            "update_s": round(plain_s, 2),
            "profiled_update_s": round(profiled_s, 2),
            "self_s_by_kind": {k: round(v, 3) for k, v in kinds.items()},
            "share_by_kind": {k: round(v / total, 4) for k, v in kinds.items()},
            "ops_by_shape": [{**r, "self_s": round(r["self_s"], 4)} for r in shaped],
            "ops": [{**r, "self_s": round(r["self_s"], 4), "kind": kind_of(r["op"])} for r in ops],
            "matmul_peak": peak,
        },
    )


if __name__ == "__main__":
    main()
