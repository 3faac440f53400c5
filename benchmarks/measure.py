"""What the benchmarks share: the machine's description, its matmul peak and memory bandwidth
measured in the same run, and FLOP counting from a model's shapes.

FLOPs are counted per token from the model's shapes (multiply-adds × 2; backward = 2 ×
forward): 2·N_body per token through the decoder (N_body: the decoder layers' parameters, no
embedding), 4·L·(heads·head_dim)·(t+1) for causal attention at position t, 2·H·V where the LM
head runs. The critic's scalar head is left out.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from ragen import models
from ragen.train.forward import shared_prefix_length
from ragen.train.update import UpdateData, by_length

# ---------------------------------------------------------------------------- the machine


def cpu_flags() -> list[str]:
    """The CPU features that decide matmul speed (AVX2, AVX-512, bf16, AMX)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return sorted(f for f in set(flags) if f.startswith(("avx", "amx", "fma")))


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")),
        platform.processor(),
    )


def machine(dtype: torch.dtype) -> dict:
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "cpu_flags": cpu_flags(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "bf16_native": models.bf16_supported(),
        "dtype": str(dtype).removeprefix("torch."),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def write_summary(out: Path, summary: dict) -> None:
    """Write a benchmark's ``summary`` as indented JSON to ``out`` (folders made) and say so."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out}")


def gemm_gflops(dtype: torch.dtype, m: int, k: int, n: int, budget_s: float) -> float:
    """Best GFLOP/s of an (m, k) @ (k, n) matmul over about ``budget_s`` seconds. Timed by
    the wall clock when torch runs several threads (they are what the peak is made of), by the
    process's CPU clock on one (the time it ran, not the time others held the core)."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b  # warm-up: first-call allocations and kernel selection
    clock = time.perf_counter if torch.get_num_threads() > 1 else time.process_time
    best, spent = 0.0, 0.0
    while spent < budget_s:
        wall, started = time.perf_counter(), clock()
        a @ b
        spent += time.perf_counter() - wall
        best = max(best, 2 * m * k * n / max(clock() - started, 1e-6) / 1e9)
    return round(best, 2)


def _best_gemms(dtype: torch.dtype, shape: dict, tokens: int) -> dict:
    """GFLOP/s of a square GEMM and the model's MLP GEMMs at ``tokens`` rows."""
    h, f = shape["hidden"], shape["intermediate"]
    return {
        "2048x2048x2048": gemm_gflops(dtype, 2048, 2048, 2048, 4.0),
        f"{tokens}x{h}x{f}": gemm_gflops(dtype, tokens, h, f, 3.0),
        f"{tokens}x{f}x{h}": gemm_gflops(dtype, tokens, f, h, 3.0),
    }


def matmul_peak(shape: dict, tokens: int) -> dict:
    """The best of a square GEMM and the model's MLP GEMMs at ``tokens`` rows, in fp32 and,
    where the CPU runs it natively, bf16; where it does not (emulated: ~100× slower), bf16 is
    one small MLP-shaped GEMM, kept short."""
    fp32 = _best_gemms(torch.float32, shape, tokens)
    if models.bf16_supported():
        bf16 = _best_gemms(torch.bfloat16, shape, tokens)
    else:
        h, f = shape["hidden"], shape["intermediate"]
        bf16 = {f"128x{h}x{f}": gemm_gflops(torch.bfloat16, 128, h, f, 3.0)}
    return {
        "fp32_gflops": max(fp32.values()),
        "bf16_gflops": max(bf16.values()),
        "fp32_shapes": fp32,
        "bf16_shapes": bf16,
    }


def copy_bandwidth(megabytes: int = 256, budget_s: float = 2.0) -> float:
    """Best GB/s of copying a ``megabytes`` float32 tensor into another (bytes read + written),
    the bound of memory-bound phases such as the optimiser's step."""
    a = torch.ones(megabytes * 2**20 // 4)
    b = torch.empty_like(a)
    b.copy_(a)  # warm-up: page faults on first touch
    best, spent = 0.0, 0.0
    while spent < budget_s:
        started = time.perf_counter()
        b.copy_(a)
        took = time.perf_counter() - started
        spent += took
        best = max(best, 2 * a.numel() * 4 / took / 1e9)
    return round(best, 1)


def timed(fn):
    """``fn()``'s result and its wall and CPU seconds (CPU time is less hurt by other load)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    took = {
        "wall_s": round(time.perf_counter() - wall, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
    }
    return result, took


# ---------------------------------------------------------------------------- FLOP counting


def model_shape(lm) -> dict:
    c = lm.config
    layers = lm.get_decoder().layers
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return {
        "layers": c.num_hidden_layers,
        "hidden": c.hidden_size,
        "intermediate": c.intermediate_size,
        "vocab": c.vocab_size,
        "attn_width": heads * head_dim,
        "n_body": sum(p.numel() for p in layers.parameters()),
        "n_total": sum(p.numel() for p in lm.parameters()),
    }


def positions_sum(start: int, stop: int) -> int:
    """Σ (t + 1) for t in [start, stop): the keys each query position attends to."""
    return (stop * (stop + 1) - start * (start + 1)) // 2


def chunk_counts(
    ids: torch.Tensor, mask: torch.Tensor, loss_mask: torch.Tensor, opening: int | None = None
) -> dict:
    """Token counts of one micro-batch (B, T), right padded, as ragen's forward runs it: its
    own shared prefix once, or, given the ``opening`` its mini-batch ran once for all its
    micro-batches, only what follows it (the opening is counted where it runs)."""
    lengths = [int(n) for n in mask.sum(dim=1)]
    prefix = shared_prefix_length(ids, mask) if opening is None else opening
    once = prefix if opening is None else 0
    rows = len(lengths)
    return {
        "rows": rows,
        "useful_tokens": sum(lengths),
        "computed_tokens": once + sum(n - prefix for n in lengths),
        "padding_tokens": rows * ids.shape[1] - sum(lengths),
        "shared_prefix": prefix,
        "head_positions": int((loss_mask[:, 1:] > 0).sum()),
        "attn_useful": sum(positions_sum(0, n) for n in lengths),
        "attn_computed": positions_sum(0, once) + sum(positions_sum(prefix, n) for n in lengths),
    }


def opening_counts(tokens: int) -> dict:
    """The counts of an opening run once for its mini-batch (or SFT step): ``tokens`` of one
    row, nothing scored (its tokens count as useful in the rows that continue from it)."""
    zero = dict.fromkeys(("rows", "useful_tokens", "padding_tokens", "head_positions"), 0)
    return {
        **zero,
        "attn_useful": 0,
        "computed_tokens": tokens,
        "shared_prefix": tokens,
        "attn_computed": positions_sum(0, tokens),
    }


def add_counts(parts: list[dict]) -> dict:
    total = {k: sum(p[k] for p in parts) for k in parts[0] if k != "shared_prefix"}
    total["micro_batches"] = sum(1 for p in parts if p["rows"])  # not the openings
    total["shared_prefix"] = [p["shared_prefix"] for p in parts]
    return total


def flops(shape: dict, tokens: int, attn: int, head_positions: int, models_: float = 2) -> float:
    """Forward FLOPs: ``models_`` decoders (policy, critic; a critic cut to some of the
    layers counts as that share of one) over ``tokens`` tokens with ``attn`` attended
    positions, plus the LM head at ``head_positions``."""
    body = 2 * shape["n_body"] * tokens + 4 * shape["layers"] * shape["attn_width"] * attn
    return models_ * body + 2 * shape["hidden"] * shape["vocab"] * head_positions


def update_minis(data: UpdateData, ppo_epochs: int, mini: int, seed: int):
    """The mini-batches ``ppo_update`` runs, in its order: ``update.mini_batch_rows``,
    recomputed here so that the work of a baseline commit's ragen (``baseline.py``), whose
    ``mini_batch_rows`` may take other arguments, is counted alike (a test holds the two
    equal): per epoch a permutation drawn from ``seed``, cut, each cut longest row first."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(ppo_epochs):
        order = torch.randperm(len(data.attention_mask), generator=generator)
        for rows in order.split(mini):
            yield data.rows(by_length(rows, data.attention_mask))


def update_chunks(data: UpdateData, ppo_epochs: int, mini: int, micro: int, seed: int):
    """The micro-batches ``ppo_update`` runs, in its order."""
    for mini_data in update_minis(data, ppo_epochs, mini, seed):
        for part in torch.arange(len(mini_data.input_ids)).split(micro):
            yield mini_data.rows(part)


def critic_share(trainer, *, backward: bool = False, beside_policy: bool = False) -> float:
    """The critic's decoder as a share of the policy's (0 without a critic): its layers over
    the policy's, as ``model.critic_layers`` cuts it. A head on the policy's trunk runs no
    backward through it (``backward``), and no forward of its own in a pass that runs the
    policy anyway (``beside_policy``): it reads that pass's hidden states."""
    critic = trainer.m.critic
    if critic is None or (critic.detached_body and (backward or beside_policy)):
        return 0.0
    return critic.config.num_hidden_layers / trainer.m.policy.config.num_hidden_layers


def scored_models(trainer, kept: int) -> tuple[float, bool]:
    """(decoders the scoring pass runs, a cut critic counted by its share of the layers;
    whether the policy's LM head is among them)."""
    on_policy = trainer.on_policy(kept)
    critic = trainer.m.critic is not None
    scored = critic and not trainer.critic_first(kept)
    critic_scored = critic_share(trainer, beside_policy=not on_policy) if scored else 0.0
    decoders = (not on_policy) + critic_scored + (trainer.m.ref is not None)
    return decoders, not on_policy or trainer.m.ref is not None
