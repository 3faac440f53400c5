"""Rollout speed on real Sokoban episodes: the fast generator against the naive reference.

    python -m benchmarks.rollout [--groups 4] [--copies 8] [--turns 5] [--max-reply-tokens 64]
        [--demos 0] [--reference naive|hf-unshared]
        [--threads N] [--device cpu|cuda] [--dtype auto] [--backend vllm-cpu]
        [--out benchmarks/results/rollout.json]

The embedded model plays P groups × N copies of Sokoban through the real rollout loop (prompts,
parsing, env steps, chat-template pieces), up to 5 turns, at temperature 1, on ``--device`` in
``--dtype`` (``auto``: bfloat16 where the device runs it natively). Both backends run the same
seeds in the same process; since each request row draws from its own noise stream, they play
the same episodes unless float rounding tips a draw (``same_episodes`` counts the episodes
whose token ids agree exactly).

Prints wall time, generated tokens/s, prefilled tokens and the speed ratio; writes JSON with a
``speedup`` field (naive wall time / hf wall time). Goal of the rollout issue: speedup ≥ 3.

``--demos N`` opens every episode with N worked turns, as the presets do (``rollout.demos``:
2, which makes the opening all rows share ~820 tokens instead of ~70).
``--reference hf-unshared`` plays the same workload with ``hf`` and with ``hf`` whose decode
batches keep the opening every row shares in each row's cache (``CachedGenerator(...,
share_prefix=False)``, how it decoded before), and writes ``rollout_shared_prefix.json``
whose ``speedup`` is the unshared wall time over the shared one.

``--backend vllm-cpu`` (run from ``.venv-vllm``, see ``make vllm-cpu-env``) plays the same
workload with the vLLM engine and with ``hf``, and writes ``rollout_vllm-cpu.json`` whose
``speedup`` is hf wall time / vLLM wall time. The engine's start is timed apart
(``startup_s``), not in ``wall_s``. vLLM draws its own sampling noise, so at temperature 1 its
episodes differ from hf's (``same_episodes`` says by how many); both replay exactly on reruns.
``--threads N`` gives vLLM's worker N threads too, unpinned like torch's
(VLLM_CPU_OMP_THREADS_BIND=nobind, OMP_NUM_THREADS=N): pinned to a core, it would share that
core with whatever else runs there while the other idles. ``engine_cpu_s`` is the CPU time
of the engine's own processes (its worker and its scheduler); ``cpu_s`` is this process's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from ragen import config, models
from ragen.rollout.engines import CachedGenerator, make_generator
from ragen.rollout.loop import RolloutSpec, rollout

GOAL_SPEEDUP = 3.0
UNSHARED = "-unshared"  # hf decoding with the shared opening copied into every row


def children_cpu_s() -> float:
    """CPU seconds so far of this process's live descendants (a vLLM engine's processes)."""
    import psutil  # a vllm dependency; only vLLM runs get here

    return sum(sum(p.cpu_times()[:2]) for p in psutil.Process().children(recursive=True))


def device_name(device: str) -> str:
    """What the benchmark ran on, in words: the GPU's name, or the CPU's architecture."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return platform.machine()


def run_backend(name: str, model, tokenizer, args) -> tuple[dict, list]:
    startup = time.perf_counter()
    generator = make_generator(name.removesuffix(UNSHARED), model, tokenizer)
    if name.endswith(UNSHARED):
        assert isinstance(generator, CachedGenerator)
        generator.share_prefix = False
    startup = time.perf_counter() - startup
    spec = RolloutSpec(
        max_turns=args.turns,
        max_actions_per_turn=2,
        max_actions_per_episode=2 * args.turns,
        max_reply_tokens=args.max_reply_tokens,
        temperature=1.0,
        demos=args.demos,
    )
    seeds = list(range(args.seed, args.seed + args.groups))
    engine = hasattr(generator, "close")  # a vLLM engine, computing in processes of its own
    wall, cpu = time.perf_counter(), time.process_time()
    engine_cpu = children_cpu_s() if engine else 0.0
    trajectories = rollout(generator, tokenizer, "sokoban", seeds, args.copies, spec)
    engine_cpu = children_cpu_s() - engine_cpu if engine else 0.0
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stats = generator.stats
    if engine:  # its processes go before the next backend runs
        generator.close()
    return {
        "startup_s": round(startup, 2),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "engine_cpu_s": round(engine_cpu, 2),
        "generated_tokens": stats.generated_tokens,
        "prefilled_tokens": stats.prefilled_tokens,
        "reused_tokens": stats.reused_tokens,
        "shared_tokens": stats.shared_tokens,
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
    parser.add_argument("--demos", type=int, default=0, help="worked turns opening each episode")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", choices=config.DTYPES)
    parser.add_argument(
        "--backend",
        choices=["vllm", "vllm-cpu"],
        help="compare this vLLM backend with hf (default: hf against naive)",
    )
    parser.add_argument(
        "--reference",
        choices=["naive", "hf" + UNSHARED],
        default="naive",
        help="what hf is compared with (not with --backend)",
    )
    parser.add_argument("--out", help="default: benchmarks/results/rollout[_BACKEND].json")
    args = parser.parse_args()
    if args.backend and args.reference != "naive":
        parser.error("--backend compares a vLLM engine with hf; leave --reference out")
    suffix = f"_{args.backend}" if args.backend else ""
    if args.reference != "naive":
        suffix = "_shared_prefix"
    out = args.out or f"benchmarks/results/rollout{suffix}.json"
    if args.threads:
        torch.set_num_threads(args.threads)
        # Read by the engine's worker process when it starts: N threads, not pinned.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    model, tokenizer = models.load_policy("smollm2-135m", dtype=args.dtype, device=args.device)
    fast, reference = (args.backend, "hf") if args.backend else ("hf", args.reference)
    results, episodes = {}, {}
    for name in (fast, reference):
        results[name], episodes[name] = run_backend(name, model, tokenizer, args)
    same = sum(
        a.token_ids == b.token_ids for a, b in zip(episodes[fast], episodes[reference], strict=True)
    )
    speedup = results[reference]["wall_s"] / results[fast]["wall_s"]
    width = max(9, *(len(name) for name in results))
    print(
        f"{'backend':<{width}} {'start s':>8} {'wall s':>8} {'cpu s':>8} {'engine s':>8} "
        f"{'gen tok/s':>10} {'generated':>10} {'prefilled':>10} {'reused':>8}"
    )
    for name, r in results.items():
        print(
            f"{name:<{width}} {r['startup_s']:>8.1f} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} "
            f"{r['engine_cpu_s']:>8.1f} "
            f"{r['generated_tokens_per_s']:>10.1f} {r['generated_tokens']:>10} "
            f"{r['prefilled_tokens']:>10} {r['reused_tokens']:>8}"
        )
    goal = "" if args.backend or args.reference != "naive" else f" (goal >= {GOAL_SPEEDUP})"
    print(
        f"speedup of {fast} over {reference} {speedup:.2f}x{goal}; "
        f"same episodes {same}/{len(episodes[fast])}"
    )
    report = {
        "command": "python -m benchmarks.rollout "
        + " ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in vars(args).items()
            if k != "out" and v is not None
        ),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": device_name(args.device),
            "dtype": str(next(model.parameters()).dtype),
        },
        "workload": {
            "env": "sokoban",
            "groups": args.groups,
            "copies": args.copies,
            "max_turns": args.turns,
            "max_reply_tokens": args.max_reply_tokens,
            "demos": args.demos,
        },
        "backends": results,
        "same_episodes": same,
        "episodes": len(episodes[fast]),
        "speedup": round(speedup, 2),
    }
    if args.backend:
        import vllm

        report["machine"]["vllm"] = vllm.__version__
        report["machine"]["vllm_threads"] = os.environ.get("OMP_NUM_THREADS", "vLLM's choice")
    elif args.reference == "naive":
        report["goal_speedup"] = GOAL_SPEEDUP
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
