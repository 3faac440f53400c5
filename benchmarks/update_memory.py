"""The memory an update's micro-batch adds, measured, beside what the update plans for it.

    python -m benchmarks.update_memory [--spec smollm2-135m]
        [--out benchmarks/results/update_memory.json]

Each case runs in a process of its own (one torch thread): the FrozenLake preset's models
(``model.critic_body=copy``, float32), a mini-batch of random token rows (no shared opening)
whose last share of tokens is sampled, and three real ``ppo_update`` calls in one micro-batch:
``policy`` (advantages given, as GRPO: the policy alone) and ``critic`` (gae on-policy: the
critic's pass first, then the policy's, their gradients both held). Before each call the
freed heap is returned and the peak resident memory reset; the case reports what the call
added to it (Linux's ``VmHWM`` less its value just reset). The first call also allocates AdamW's
moments, so the figure compared is the least of the two after it.

The estimate (``ragen.train.update_memory``) is the gradients of the trained parameters plus
the larger pass's activations: ``micro_batch_bytes`` of the policy (and, apart, the critic's
body). The ratio measured / estimate is what the planner's free-memory share must cover.

Then, where this process may make a memory cgroup (root, Linux), the plan at work: one
``policy`` update of ``LIMITED`` rows in one configured micro-batch, in a cgroup limited to
``--limit-gib``, first without the plan (``plan_memory`` off: the kernel kills it), then with
it (it finishes in smaller passes); each one's exit status, cuts and peak in the cgroup.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.measure import machine, write_summary
from ragen import metric_names as names

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
LIMITED = ("policy", 4, 1024, 0.2)  # a configured micro-batch of about 6 GiB, model included


def new_cgroup(limit: int) -> Path | None:
    """A memory cgroup of this machine limited to ``limit`` bytes (v1 or v2), or None where
    this process may not make one (not root, no memory controller)."""
    for root, name in ((Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
                       (Path("/sys/fs/cgroup"), "memory.max")):  # fmt: skip
        folder = root / f"ragen-{os.getpid()}-{limit}"
        try:
            folder.mkdir()
        except OSError:
            continue
        try:
            (folder / name).write_text(str(limit))
            return folder
        except OSError:
            folder.rmdir()
    return None


def _cgroup_peak(folder: Path) -> int | None:
    for name in ("memory.max_usage_in_bytes", "memory.peak"):  # v1, v2
        try:
            return int((folder / name).read_text())
        except (OSError, ValueError):
            continue
    return None


def limited(spec: str, limit_gib: float) -> list[dict] | None:
    """The ``LIMITED`` update in a cgroup of ``limit_gib``, without and with the plan."""
    rows = []
    for plan in (False, True):
        folder = new_cgroup(int(limit_gib * 2**30))
        if folder is None:
            return None
        command = [sys.executable, "-m", "benchmarks.update_memory", "--spec", spec]
        try:
            done = subprocess.run(
                [*command, "--one", json.dumps([*LIMITED, plan])],
                cwd=ROOT,
                preexec_fn=lambda f=folder: (f / "cgroup.procs").write_text(str(os.getpid())),
                capture_output=True,
                text=True,
                check=False,
            )
            peak = _cgroup_peak(folder)
        finally:
            folder.rmdir()
        case = json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else {}
        rows.append(
            {
                "plan": plan,
                "limit_gib": limit_gib,
                "exit_status": done.returncode,
                "update_memory_cuts": case.get("update_memory_cuts"),
                "cgroup_peak_gib": None if peak is None else round(peak / 2**30, 2),
            }
        )
    return rows


def one_case(
    spec: str, mode: str, rows: int, tokens: int, share: float, plan: bool = False
) -> dict:
    """Measure one case in this process (``plan``: the update plans its micro-batches from
    the memory free); returns its figures."""
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
    settings = UpdateSettings(c.algo, c.trainer, c.rollout.temperature, None, plan_memory=plan)
    optimizers = m.optimizers if critic is not None else {"actor": m.optimizers["actor"]}
    added = []
    for _ in range(CALLS):
        trim_heap()
        reset_peak_rss()
        before = peak_rss()  # just reset: the memory held now
        metrics = ppo_update(m.policy, critic, optimizers, data, settings, seed=0)
        peak = peak_rss()
        assert peak is not None and before is not None, "the benchmark needs Linux's /proc"
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
        "update_memory_cuts": metrics.get(names.UPDATE_MEMORY_CUTS),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/update_memory.json")
    parser.add_argument("--limit-gib", type=float, default=5.0)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a case, in its own process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_case(args.spec, *json.loads(args.one))))
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
    summary["limited"] = limited(args.spec, args.limit_gib)
    if summary["limited"] is None:
        print("no memory cgroup could be made here (needs root): the limited case is skipped")
    for row in summary["limited"] or []:
        print(
            f"{LIMITED[1]} rows × {LIMITED[2]} tokens in {row['limit_gib']} GiB, plan "
            f"{'on ' if row['plan'] else 'off'}: exit status {row['exit_status']}, cuts "
            f"{row['update_memory_cuts']}, cgroup peak {row['cgroup_peak_gib']} GiB"
        )
    write_summary(args.out, summary)


if __name__ == "__main__":
    main()
