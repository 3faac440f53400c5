"""Rollout speed on real Sokoban episodes: the fast generator against the naive reference.

    python benchmarks/rollout.py [--groups 4] [--copies 8] [--turns 5] [--max-reply-tokens 64]
        [--threads N] [--out benchmarks/results/rollout.json]

The embedded model plays P groups × N copies of Sokoban through the real rollout loop (prompts,
parsing, env steps, chat-template pieces), up to 5 turns, at temperature 1, in the dtype
``auto`` picks here. Both backends run the same seeds in the same process; since each request
row draws from its own noise stream, they play the same episodes unless float rounding tips a
draw (``same_episodes`` counts the episodes whose token ids agree exactly).

Prints wall time, generated tokens/s, prefilled tokens and the speed ratio; writes JSON with a
``speedup`` field (naive wall time / hf wall time). Goal of the rollout issue: speedup ≥ 3.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from ragen import models
from ragen.rollout.generator import make_generator
from ragen.rollout.loop import RolloutSpec, rollout

GOAL_SPEEDUP = 3.0


def run_backend(name: str, model, tokenizer, args) -> tuple[dict, list]:
    generator = make_generator(name, model, tokenizer)
    spec = RolloutSpec(
        max_turns=args.turns,
        max_actions_per_turn=2,
        max_actions_per_episode=2 * args.turns,
        max_reply_tokens=args.max_reply_tokens,
        temperature=1.0,
    )
    seeds = list(range(args.seed, args.seed + args.groups))
    wall, cpu = time.perf_counter(), time.process_time()
    trajectories = rollout(generator, tokenizer, "sokoban", seeds, args.copies, spec)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stats = generator.stats
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "generated_tokens": stats.generated_tokens,
        "prefilled_tokens": stats.prefilled_tokens,
        "reused_tokens": stats.reused_tokens,
        "generated_tokens_per_s": round(stats.generated_tokens / wall, 1),
        "turns": sum(len(t.turns) for t in trajectories),
    }, trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--copies", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-reply-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--out", default="benchmarks/results/rollout.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = models.load_policy("smollm2-135m", dtype="auto")
    results, episodes = {}, {}
    for name in ("hf", "naive"):
        results[name], episodes[name] = run_backend(name, model, tokenizer, args)
    same = sum(
        a.token_ids == b.token_ids for a, b in zip(episodes["hf"], episodes["naive"], strict=True)
    )
    speedup = results["naive"]["wall_s"] / results["hf"]["wall_s"]
    print(
        f"{'backend':<8} {'wall s':>8} {'cpu s':>8} {'gen tok/s':>10} {'generated':>10} "
        f"{'prefilled':>10} {'reused':>8}"
    )
    for name, r in results.items():
        print(
            f"{name:<8} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} "
            f"{r['generated_tokens_per_s']:>10.1f} {r['generated_tokens']:>10} "
            f"{r['prefilled_tokens']:>10} {r['reused_tokens']:>8}"
        )
    print(
        f"speedup {speedup:.2f}x (goal >= {GOAL_SPEEDUP}); "
        f"same episodes {same}/{len(episodes['hf'])}"
    )
    report = {
        "command": "python benchmarks/rollout.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "dtype": str(next(model.parameters()).dtype),
        },
        "workload": {
            "env": "sokoban",
            "groups": args.groups,
            "copies": args.copies,
            "max_turns": args.turns,
            "max_reply_tokens": args.max_reply_tokens,
        },
        "backends": results,
        "same_episodes": same,
        "episodes": len(episodes["hf"]),
        "speedup": round(speedup, 2),
        "goal_speedup": GOAL_SPEEDUP,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
