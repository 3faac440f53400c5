"""One decode step's attention in one layer of the embedded model: transformers' SDPA paths
against ragen's decode attention, at the shapes rollouts and evaluations decode.

    python -m benchmarks.attention [--shapes 20x1323 32x1000 64x900] [--shared 64 128 256 734]
        [--threads 1 2] [--dtype bfloat16] [--out benchmarks/results/attention.json]

A shape RxK is R rows, each with K keys in the layer's cache (a view into a buffer with room
for 96 more, as the generator holds it), one new query token per row, SmolLM2-135M's heads
(9 query heads over 3 key/value heads of 64). Timed, median of repeats, per call:

- ``sdpa, no mask (enable_gqa)``: transformers' sdpa when no row is padded;
- ``sdpa, mask (folded)``: transformers' sdpa when some row is padded (its ``pack_gqa``: the
  query heads of a key/value head become its queries, with the padding mask);
- ``ragen, no mask (folded)``: ``ragen.rollout.engines.attention.decode_attention`` when no row is
  padded (the folded form without a mask); with a mask it is the row above;
- ``ragen, shared prefix``: ``decode_attention`` given the first ``--shared`` of the K
  tokens (the opening every rollout row starts with: 734 tokens in the Sokoban preset) held
  once for all rows, the padding mask over each row's own columns; one cell per value of
  ``--shared`` (the generator shares from ``_MIN_SHARED_PREFIX`` = 128 tokens up).

Each is the function the model's attention layer calls, on the query, keys and values it
would pass (``transformers.integrations.sdpa_attention.sdpa_attention_forward`` for the
first two).

Beside each: the keys and values it must read (GB/s over R·K·3·64·2 elements; with a shared
prefix, (P + R·(K - P))·3·64·2) against the copy bandwidth measured in the same run, which is
the bound a decode attention can reach.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from benchmarks.measure import copy_bandwidth, machine, write_summary
from ragen.rollout.engines.attention import PREFIX_KEYWORD, decode_attention

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


def split(key, value, mask, shared: int):
    """The same cache with its first ``shared`` columns held once, as the generator holds a
    batch's common prefix: (prefix (1, 2, 3, P, 64), own key and value views (R, 3, K-P, 64),
    own mask (R, 1, 1, K-P)); row 0's padding moves to the front of its own columns."""
    prefix = torch.stack([key[0, :, :shared], value[0, :, :shared]])[None].contiguous()
    own = key.shape[2] - shared
    buffer = torch.stack([key[:, :, shared:], value[:, :, shared:]])  # (2, R, 3, K-P, 64)
    buffer = torch.cat([buffer, buffer.new_zeros(*buffer.shape[:3], ROOM, buffer.shape[-1])], 3)
    own_mask = mask[..., shared:].clone()
    own_mask[0, ..., : own // 4] = False
    return prefix, buffer[0, :, :, :own], buffer[1, :, :, :own], own_mask


def shared_name(shared: int) -> str:
    return f"ragen, shared prefix of {shared}"


def paths(query, key, value, mask, shared: list[int]) -> dict:
    """name -> a call of the attention function it names, as the model's layer calls it."""
    layer = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True, layer_idx=0)
    scale = HEAD_DIM**-0.5

    def cascade(prefix, own_key, own_value, own_mask):
        kwargs = {PREFIX_KEYWORD: prefix}
        return lambda: decode_attention(
            layer, query, own_key, own_value, own_mask, scaling=scale, **kwargs
        )

    held_once = {shared_name(p): cascade(*split(key, value, mask, p)) for p in shared}
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
    } | held_once


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
    parser.add_argument(
        "--shared", type=int, nargs="+", default=[64, 128, 256, 734], help="keys every row shares"
    )
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
            if not all(0 < p < keys for p in args.shared):
                sys.exit(f"--shared must lie between 0 and each shape's keys; got {args.shared}")
            element = 2 * KV_HEADS * HEAD_DIM * key.element_size() / 1e9  # a token's K and V
            cell = {"threads": threads, "rows": rows, "keys": keys, "copy_gb_per_s": bandwidth}
            cell["paths"] = {}
            read = {shared_name(p): p + rows * (keys - p) for p in args.shared}
            for name, call in paths(query, key, value, mask, args.shared).items():
                gbytes = read.get(name, rows * keys) * element
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
            # What holding the shared prefix once saves against the padded batch's kernel.
            masked = cell["paths"]["sdpa, mask (folded)"]["ms"]
            cell["speedup_shared"] = {
                str(p): round(masked / cell["paths"][shared_name(p)]["ms"], 2) for p in args.shared
            }
            cells.append(cell)
            times = "  ".join(f"{n}: {p['ms']:7.2f} ms" for n, p in cell["paths"].items())
            held = ", ".join(f"{p}: {x:.2f}x" for p, x in cell["speedup_shared"].items())
            print(
                f"threads {threads}  {rows:3d} rows x {keys:5d} keys  {times}  "
                f"ragen / sdpa without a mask: {cell['speedup_no_mask']:.2f}x faster; "
                f"prefix held once / masked: {held}",
                flush=True,
            )
    summary = {
        "command": "python -m benchmarks.attention " + " ".join(sys.argv[1:]),
        "machine": machine(dtype),
        "heads": {"query": HEADS, "key_value": KV_HEADS, "dim": HEAD_DIM},
        "cells": cells,
    }
    write_summary(args.out, summary)


if __name__ == "__main__":
    main()
