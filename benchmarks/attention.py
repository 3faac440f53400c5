"""One decode step's attention in one layer of the embedded model: transformers' SDPA paths
against ragen's decode attention, at the shapes rollouts and evaluations decode.

    python benchmarks/attention.py [--shapes 20x1323 32x1000 64x900] [--threads 1 2]
        [--dtype bfloat16] [--out benchmarks/results/attention.json]

A shape RxK is R rows, each with K keys in the layer's cache (a view into a buffer with room
for 96 more, as the generator holds it), one new query token per row, SmolLM2-135M's heads
(9 query heads over 3 key/value heads of 64). Timed, median of repeats, per call:

- ``sdpa, no mask (enable_gqa)``: transformers' sdpa when no row is padded;
- ``sdpa, mask (folded)``: transformers' sdpa when some row is padded (its ``pack_gqa``: the
  query heads of a key/value head become its queries, with the padding mask);
- ``ragen, no mask (folded)``: ``ragen.rollout.attention.decode_attention`` when no row is
  padded (the folded form without a mask); with a mask it is the row above.

Each is the function the model's attention layer calls, on the query, keys and values it
would pass (``transformers.integrations.sdpa_attention.sdpa_attention_forward`` for the
first two).

Beside each: the keys and values it must read (GB/s over R·K·3·64·2 elements) against the
copy bandwidth measured in the same run, which is the bound a decode attention can reach.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from measure import copy_bandwidth, machine
from ragen.rollout.attention import decode_attention

ROOT = Path(__file__).parent.parent
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M
ROOM = 96  # the buffer's columns past the filled ones: a reply's tokens


def inputs(rows: int, keys: int, dtype: torch.dtype):
    """(query (R, 9, 1, 64), key and value views (R, 3, K, 64), mask (R, 1, 1, K) bool)."""
    g = torch.Generator().manual_seed(0)
    buffer = torch.randn(2, rows, KV_HEADS, keys + ROOM, HEAD_DIM, generator=g).to(dtype)
    query = torch.randn(rows, HEADS, 1, HEAD_DIM, generator=g).to(dtype)
    mask = torch.ones(rows, 1, 1, keys, dtype=torch.bool)
    mask[0, ..., : keys // 4] = False  # one row padded: a quarter of its columns
    return query, buffer[0, :, :, :keys], buffer[1, :, :, :keys], mask


def paths(query, key, value, mask) -> dict:
    """name -> a call of the attention function it names, as the model's layer calls it."""
    layer = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)
    scale = HEAD_DIM**-0.5
    return {
        "sdpa, no mask (enable_gqa)": lambda: sdpa_attention_forward(
            layer, query, key, value, None, scaling=scale
        ),
        "sdpa, mask (folded)": lambda: sdpa_attention_forward(
            layer, query, key, value, mask, scaling=scale
        ),
        "ragen, no mask (folded)": lambda: decode_attention(
            layer, query, key, value, None, scaling=scale
        ),
    }


def seconds(call, budget_s: float = 1.0) -> float:
    """Median wall seconds of ``call()`` over repeats filling about ``budget_s``."""
    call()  # warm-up
    runs: list[float] = []
    while sum(runs) < budget_s or len(runs) < 5:
        started = time.perf_counter()
        call()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["20x1323", "32x1000", "64x900"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/attention.json")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    try:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    except ValueError:
        sys.exit(f"--shapes takes ROWSxKEYS, e.g. 20x1323; got {' '.join(args.shapes)}")

    cells = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        bandwidth = copy_bandwidth()
        for rows, keys in shapes:
            query, key, value, mask = inputs(rows, keys, dtype)
            gbytes = 2 * key.numel() * key.element_size() / 1e9  # keys and values read
            cell = {"threads": threads, "rows": rows, "keys": keys, "copy_gb_per_s": bandwidth}
            cell["paths"] = {}
            for name, call in paths(query, key, value, mask).items():
                took = seconds(call)
                cell["paths"][name] = {
                    "ms": round(took * 1e3, 3),
                    "gb_per_s": round(gbytes / took, 1),
                    "share_of_copy": round(gbytes / took / bandwidth, 3),
                }
            # What ragen's attention saves where no row is padded, same run and shape.
            plain = cell["paths"]["sdpa, no mask (enable_gqa)"]["ms"]
            cell["speedup_no_mask"] = round(
                plain / cell["paths"]["ragen, no mask (folded)"]["ms"], 2
            )
            cells.append(cell)
            times = "  ".join(f"{n}: {p['ms']:7.2f} ms" for n, p in cell["paths"].items())
            print(
                f"threads {threads}  {rows:3d} rows x {keys:5d} keys  {times}  "
                f"ragen / sdpa without a mask: {cell['speedup_no_mask']:.2f}x faster",
                flush=True,
            )
    summary = {
        "command": "python benchmarks/attention.py " + " ".join(sys.argv[1:]),
        "machine": machine(dtype),
        "heads": {"query": HEADS, "key_value": KV_HEADS, "dim": HEAD_DIM},
        "cells": cells,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
