"""Decoding speed: ragen's default generator against llama.cpp on the same model and work.

    make llama-cpp     # once: llama.cpp's llama-batched-bench built from source in .bench/
    python -m benchmarks.decode [--batches 1 8 32] [--threads 1 2] [--prompt 300] [--reply 64]
        [--repeats 2] [--out benchmarks/results/decode.json]

The work, the same for both engines: one prompt of ``--prompt`` tokens shared by a batch of B
rows (prefilled once), then ``--reply`` tokens for every row, none stopping early. The figure
is generated tokens per second end to end, prefill included: B·reply / (prefill + decode).

- ragen: the ``hf`` backend (``CachedGenerator``, what rollouts run) with a stopper that never
  fires, sampling at temperature 1 (its sampling is in the time), weights in float32 and, as
  an extra row, in the dtype rollouts use on this machine (``auto``); and, as the reference
  it improves on, float32 decoding with transformers' own ``sdpa`` attention instead of
  ``ragen.rollout.engines.attention`` (rows of one shared prompt carry no mask, which sends
  transformers to its slow ``enable_gqa`` kernel).
- llama.cpp: ``llama-batched-bench -pps`` (shared prompt, every row's logits computed, no
  sampling) on a float32 GGUF that llama.cpp's own ``convert_hf_to_gguf.py`` writes from the
  same weights, and where rollouts sample in bf16 here, on a bf16 GGUF too: the engine a
  rollout backend built on llama.cpp would run. llama.cpp is never a dependency of ragen:
  the Makefile builds it from the copy vendored in llama-cpp-python's source release (PyPI),
  in ``.bench/``.

Cells run one engine after the other per (threads, batch), so load from others falls on both;
each is the median of ``--repeats`` runs. The bound column is the time the work needs at the
machine's fp32 matmul peak and copy bandwidth, both measured in the same run: per decode step
the larger of its FLOPs at peak and its weight bytes at bandwidth, plus the prefill's FLOPs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.measure import (
    copy_bandwidth,
    flops,
    machine,
    matmul_peak,
    model_shape,
    positions_sum,
)
from ragen import config, models
from ragen.rollout.engines import CachedGenerator, Request, Stopper, attention

ROOT = Path(__file__).parent.parent
LLAMA_DIR = ROOT / ".bench" / "llama.cpp"
BENCH_BINARY = Path("build") / "bin" / "llama-batched-bench"


# ---------------------------------------------------------------------------- ragen


def ragen_seconds(
    model, tokenizer, batch: int, prompt: list[int], reply: int, seed: int, kernel: str
) -> float:
    """Wall seconds for ``batch`` rows sharing ``prompt`` to each sample ``reply`` tokens,
    decoding with the attention implementation ``kernel``."""
    never = Stopper(tokenizer, eos=(), stop_strings=())
    generator = CachedGenerator(model, never)
    model.set_attn_implementation(kernel)
    requests = [Request(("row", i), prompt) for i in range(batch)]
    started = time.perf_counter()
    samples = generator.generate(requests, max_new_tokens=reply, temperature=1.0, seed=seed)
    took = time.perf_counter() - started
    if any(len(s.token_ids) != reply for s in samples):
        raise RuntimeError("a row stopped early although its stopper never fires")
    return took


# ---------------------------------------------------------------------------- llama.cpp


def gguf_file(llama_dir: Path, dtype: str) -> Path:
    """The embedded model as a GGUF in ``dtype``, converted once by llama.cpp's own script."""
    out = llama_dir.parent / f"smollm2-135m-{dtype}.gguf"
    if out.exists():
        return out
    folder = models.prepare(config.DEFAULT_SPEC).path
    env = {**os.environ, "PYTHONPATH": str(llama_dir / "gguf-py")}
    script = llama_dir / "convert_hf_to_gguf.py"
    partial = out.with_suffix(".part")
    command = [
        sys.executable,
        str(script),
        str(folder),
        "--outtype",
        dtype,
        "--outfile",
        str(partial),
    ]
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    partial.rename(out)
    return out


def llama_seconds(binary: Path, gguf: Path, threads: int, batch: int, prompt: int, reply: int):
    """(prefill seconds, decode seconds) of one llama-batched-bench run."""
    context = prompt + batch * reply + 16
    command = [
        str(binary), "-m", str(gguf), "-c", str(context), "-b", "2048", "-ub", "512",
        "-npp", str(prompt), "-ntg", str(reply), "-npl", str(batch), "-pps", "-kvu",
        "-t", str(threads), "-tb", str(threads), "--output-format", "jsonl",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    rows += [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    if run.returncode or not rows:
        raise RuntimeError(f"llama-batched-bench failed ({run.returncode}):\n{run.stderr[-2000:]}")
    return rows[0]["t_pp"], rows[0]["t_tg"]


# ---------------------------------------------------------------------------- the bound


def bound_seconds(shape: dict, batch: int, prompt: int, reply: int, peak: float, bandwidth: float):
    """Seconds the work needs at ``peak`` GFLOP/s and ``bandwidth`` GB/s (float32 weights)."""
    prefill = flops(shape, prompt, positions_sum(0, prompt), 1, models_=1) / (peak * 1e9)
    weight_bytes = 4 * shape["n_total"]
    decode = 0.0
    for step in range(reply - 1):  # the last token is sampled, never fed back
        position = prompt + step
        step_flops = flops(shape, batch, batch * (position + 1), batch, models_=1)
        decode += max(step_flops / (peak * 1e9), weight_bytes / (bandwidth * 1e9))
    return prefill + decode


# ---------------------------------------------------------------------------- the table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--prompt", type=int, default=300, help="prompt tokens, shared")
    parser.add_argument("--reply", type=int, default=64, help="tokens generated per row")
    parser.add_argument("--repeats", type=int, default=2, help="runs per cell (median)")
    parser.add_argument("--llama-dir", type=Path, default=LLAMA_DIR)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/decode.json")
    args = parser.parse_args()

    binary = args.llama_dir / BENCH_BINARY
    if not binary.exists():
        sys.exit(f"{binary} is missing: build it with `make llama-cpp` (from source, minutes)")
    ggufs = {"llama.cpp float32": gguf_file(args.llama_dir, "f32")}
    fp32, tokenizer = models.load_policy(config.DEFAULT_SPEC, dtype="float32")
    # name -> (model, attention); the rows of one prompt carry no mask, so transformers'
    # own sdpa decodes them with enable_gqa, the kernel ragen's attention keeps them off.
    policies = {
        "ragen float32": (fp32, attention.NAME),
        "ragen float32, transformers sdpa": (fp32, "sdpa"),
    }
    auto_dtype = str(models.resolve_dtype("auto")).removeprefix("torch.")
    if auto_dtype != "float32":  # the dtype rollouts sample in here, as an extra row
        auto, _ = models.load_policy(config.DEFAULT_SPEC, dtype="auto")
        policies[f"ragen {auto_dtype} (auto)"] = (auto, attention.NAME)
    if auto_dtype == "bfloat16":  # what a llama.cpp rollout backend would sample in here
        ggufs["llama.cpp bfloat16"] = gguf_file(args.llama_dir, "bf16")
    shape = model_shape(fp32)
    prompt = [random.Random(0).randrange(3, shape["vocab"]) for _ in range(args.prompt)]

    cells = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        peak = matmul_peak(shape, max(args.batches))["fp32_gflops"]
        bandwidth = copy_bandwidth()
        for policy, kernel in policies.values():  # warm-up: first-call allocations, kernels
            ragen_seconds(policy, tokenizer, max(args.batches), prompt, 4, 0, kernel)
        for batch in args.batches:
            generated = batch * args.reply
            bound = bound_seconds(shape, batch, args.prompt, args.reply, peak, bandwidth)
            timings: dict[str, list[float]] = {name: [] for name in [*ggufs, *policies]}
            for repeat in range(args.repeats):
                for name, gguf in ggufs.items():
                    t_pp, t_tg = llama_seconds(
                        binary, gguf, threads, batch, args.prompt, args.reply
                    )
                    timings[name].append(t_pp + t_tg)
                for name, (policy, kernel) in policies.items():
                    took = ragen_seconds(
                        policy, tokenizer, batch, prompt, args.reply, repeat, kernel
                    )
                    timings[name].append(took)
            cell = {"threads": threads, "batch": batch, "generated_tokens": generated}
            cell["bound_s"] = round(bound, 3)
            cell["bound_tokens_per_s"] = round(generated / bound, 1)
            cell["fp32_peak_gflops"], cell["copy_gb_per_s"] = peak, bandwidth
            cell["engines"] = {
                name: {
                    "seconds": [round(s, 3) for s in runs],
                    "tokens_per_s": round(generated / statistics.median(runs), 1),
                }
                for name, runs in timings.items()
            }
            cells.append(cell)
            print(_row(cell), flush=True)
    _write(args, cells, fp32)


def _row(cell: dict) -> str:
    engines = cell["engines"]
    speeds = "  ".join(f"{n}: {e['tokens_per_s']:7.1f}" for n, e in engines.items())
    return (
        f"threads {cell['threads']}  batch {cell['batch']:3d}  tokens/s  {speeds}  "
        f"bound: {cell['bound_tokens_per_s']:7.1f}"
    )


def _write(args, cells: list[dict], model) -> None:
    names = list(cells[0]["engines"])
    ratios = [
        c["engines"]["ragen float32"]["tokens_per_s"]
        / c["engines"]["llama.cpp float32"]["tokens_per_s"]
        for c in cells
    ]
    print(
        f"\n{'threads':>7} {'batch':>5} " + " ".join(f"{n:>24}" for n in names) + f" {'bound':>8}"
    )
    for c in cells:
        speeds = " ".join(f"{c['engines'][n]['tokens_per_s']:24.1f}" for n in names)
        print(f"{c['threads']:7d} {c['batch']:5d} {speeds} {c['bound_tokens_per_s']:8.1f}")
    print(f"ragen float32 / llama.cpp float32: {min(ratios):.2f}x to {max(ratios):.2f}x")
    bf16 = [
        c["engines"]["ragen bfloat16 (auto)"]["tokens_per_s"]
        / c["engines"]["llama.cpp bfloat16"]["tokens_per_s"]
        for c in cells
        if "llama.cpp bfloat16" in c["engines"]
    ]
    if bf16:
        print(f"ragen bfloat16 / llama.cpp bfloat16: {min(bf16):.2f}x to {max(bf16):.2f}x")
    summary = {
        "command": "python -m benchmarks.decode " + " ".join(sys.argv[1:]),
        "workload": {"prompt_tokens": args.prompt, "reply_tokens": args.reply,
                     "prompt_shared": True, "repeats": args.repeats, "statistic": "median"},
        "machine": machine(torch.float32),
        "llama_cpp": "llama-batched-bench -pps -kvu, GGUFs by convert_hf_to_gguf.py",
        "cells": cells,
        "ragen_over_llama_cpp_float32": [round(r, 3) for r in ratios],
        "ragen_over_llama_cpp_bfloat16": [round(r, 3) for r in bf16],
        "goal": "ragen at least llama.cpp's tokens/s at every batch size and thread count",
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
