"""The memory an update's micro-batch adds, measured, beside what the update plans for it.

    python -m benchmarks.update_memory [--spec smollm2-135m]
        [--out benchmarks/results/update_memory.json]

Each case runs in a process of its own (one torch thread): the FrozenLake preset's models
(``model.critic_body=copy``, float32), a mini-batch of random token rows (no shared opening)
whose last share of tokens is sampled, and three real ``ppo_update`` calls in one micro-batch:
``policy`` (advantages given, as GRPO: the policy alone) and ``critic`` (gae on-policy: the
critic's pass first, then the policy's, their gradients both held). Before each call the
freed heap is returned and the peak resident memory reset; the case reports what the call
added to it (Linux's ``VmHWM`` less ``VmRSS`` before). The first call also allocates AdamW's
moments, so the figure compared is the least of the two after it.

The estimate (``ragen.train.update_memory``) is the gradients of the trained parameters plus
the larger pass's activations: ``micro_batch_bytes`` of the policy (and, apart, the critic's
body). The ratio measured / estimate is what the planner's free-memory share must cover.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.measure import machine, write_summary

ROOT = Path(__file__).resolve().parents[1]
# (mode, rows, tokens per row, share of them sampled)
CASES = [
    ("policy", 1, 256, 0.2),
    ("policy", 1, 512, 0.2),
    ("policy", 1, 1024, 0.2),
    ("policy", 2, 512, 0.2),
    ("policy", 1, 1024, 0.05),
    ("policy", 1, 1024, 0.5),
    ("critic", 1, 512, 0.2),
    ("critic", 1, 1024, 0.2),
]
CALLS = 3


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status: the benchmark needs Linux")


def one_case(spec: str, mode: str, rows: int, tokens: int, share: float) -> dict:
    """Measure one case in this process; returns its figures."""
    from ragen import config
    from ragen.host.memory import peak_rss, reset_peak_rss, trim_heap
    from ragen.train import setup
    from ragen.train.update import UpdateData, UpdateSettings, ppo_update
    from ragen.train.update_memory import DecoderBytes, micro_batch_bytes, trained_bytes

    torch.set_num_threads(1)
    c = config.load(
        "frozen-lake",
        [
            f"model.spec={spec}",
            f"algo.estimator={'grpo' if mode == 'policy' else 'gae'}",
            "algo.kl_coef=0",
            f"trainer.mini_batch_size={rows}",
            f"trainer.micro_batch_size={rows}",
            "trainer.ppo_epochs=1",
            "trainer.update_dtype=float32",
            "model.critic_body=copy",
        ],
    )
    m = setup.build_models(c, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (rows, tokens), generator=generator)
    sampled = int(tokens * share)
    loss_mask = torch.zeros(rows, tokens, dtype=torch.bool)
    loss_mask[:, tokens - sampled :] = True
    rewards = torch.zeros(rows, tokens)
    rewards[:, -1] = torch.randn(rows, generator=generator)
    critic = m.critic if mode == "critic" else None
    advantages = torch.randn(rows, tokens, generator=generator) * loss_mask
    data = UpdateData(
        ids,
        torch.ones(rows, tokens, dtype=torch.long),
        loss_mask,
        None if critic is not None else advantages,
        None,
        None,
        None,
        None,
        rewards=rewards if critic is not None else None,
    )
    settings = UpdateSettings(c.algo, c.trainer, c.rollout.temperature, None)
    optimizers = m.optimizers if critic is not None else {"actor": m.optimizers["actor"]}
    added = []
    for _ in range(CALLS):
        trim_heap()
        before = _rss()
        reset_peak_rss()
        ppo_update(m.policy, critic, optimizers, data, settings, seed=0)
        peak = peak_rss()
        assert peak is not None
        added.append(peak - before)
    policy_cost = DecoderBytes.of(m.policy.config, head=True)
    assert policy_cost is not None
    passes = [micro_batch_bytes(policy_cost, rows, tokens, 0, rows * sampled)]
    if critic is not None:
        critic_cost = DecoderBytes.of(m.critic.body.config, head=False)
        assert critic_cost is not None
        passes.append(micro_batch_bytes(critic_cost, rows, tokens, 0, 0))
    estimate = trained_bytes(m.policy, critic) + max(passes)
    measured = min(added[1:])
    return {
        "mode": mode,
        "rows": rows,
        "tokens": tokens,
        "sampled_per_row": sampled,
        "added_mib": [round(a / 2**20, 1) for a in added],
        "measured_mib": round(measured / 2**20, 1),
        "estimate_mib": round(estimate / 2**20, 1),
        "measured_over_estimate": round(measured / estimate, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/update_memory.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a case, in its own process
    args = parser.parse_args()
    if args.one:
        mode, rows, tokens, share = json.loads(args.one)
        print(json.dumps(one_case(args.spec, mode, rows, tokens, share)))
        return
    results = []
    print(f"{'case':28s} {'measured MiB':>13s} {'estimate MiB':>13s} {'ratio':>6s}")
    for case in CASES:
        command = [sys.executable, "-m", "benchmarks.update_memory", "--spec", args.spec]
        done = subprocess.run(
            [*command, "--one", json.dumps(case)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            sys.exit(f"case {case} failed:\n{done.stderr[-2000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(row)
        name = f"{row['mode']} {row['rows']}×{row['tokens']} ({row['sampled_per_row']} sampled)"
        print(
            f"{name:28s} {row['measured_mib']:13.1f} {row['estimate_mib']:13.1f} "
            f"{row['measured_over_estimate']:6.3f}",
            flush=True,
        )
    ratios = [r["measured_over_estimate"] for r in results]
    summary = {
        "machine": machine(torch.float32),
        "spec": args.spec,
        "cases": results,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }
    print(f"measured / estimate: {min(ratios):.3f} to {max(ratios):.3f}")
    write_summary(args.out, summary)


if __name__ == "__main__":
    main()
