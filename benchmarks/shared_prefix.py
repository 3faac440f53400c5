"""Decoding over a prefix every row shares: held once per batch against copied into every row.

    python -m benchmarks.shared_prefix [--batches 8 32 64] [--prefix 820] [--own 150]
        [--reply 96] [--threads 2] [--repeats 2] [--out benchmarks/results/shared_prefix.json]

The work of a rollout turn in the Sokoban preset: B rows that start with the same ``--prefix``
tokens (the opening: system line, two worked turns, rules: ~820 tokens), then ``--own``
tokens of their own (their level and earlier turns), each sampling ``--reply`` tokens that
never stop, at temperature 1, with the embedded model in the dtype rollouts sample in here
(``auto``). The same requests run through ``CachedGenerator`` twice per repeat, taking turns:
``share_prefix=True`` (the default: the decode attention reads the prefix once per step for
the whole batch, ``ragen.rollout.engines.attention``) and ``share_prefix=False`` (every row's cache
holds its own copy of it, how rollouts decoded before). Both sample from the same noise; the
``same_replies`` count says how many rows drew identical tokens (float rounding can tip a
draw). The figures are decode seconds (prefill excluded, as it is the same work for both),
the median over repeats, and generated tokens per second.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.measure import machine, write_summary
from ragen import models, phases
from ragen.rollout.engines import CachedGenerator, Request, Stopper
from ragen.rollout.engines.attention import use_decode_attention

ROOT = Path(__file__).parent.parent


def requests_for(batch: int, prefix: int, own: int, vocab: int) -> list[Request]:
    """``batch`` requests sharing ``prefix`` random token ids, then ``own`` of their own."""
    rng = random.Random(0)
    shared = [rng.randrange(100, vocab) for _ in range(prefix)]
    return [
        Request(("row", b), shared + [rng.randrange(100, vocab) for _ in range(own)])
        for b in range(batch)
    ]


def decode_seconds(model, tokenizer, requests, reply: int, share: bool) -> tuple[float, list]:
    """(decode seconds, samples) of one generate call; the prefill's seconds are left out."""
    never = Stopper(tokenizer, eos=(), stop_strings=())
    generator = CachedGenerator(model, never, share_prefix=share)
    phases.drain()
    samples = generator.generate(requests, max_new_tokens=reply, temperature=1.0, seed=1)
    took = phases.drain()[phases.ROLLOUT_DECODE]
    if any(len(s.token_ids) != reply for s in samples):
        raise RuntimeError("a row stopped early although its stopper never fires")
    return took, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--prefix", type=int, default=820, help="tokens every row shares")
    parser.add_argument("--own", type=int, default=150, help="tokens of each row's own")
    parser.add_argument("--reply", type=int, default=96, help="tokens sampled per row")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs per cell (median)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/shared_prefix.json")
    args = parser.parse_args()
    if min(args.batches) < 2 or args.prefix < 1 or args.own < 0 or args.reply < 2:
        sys.exit("--batches of 2 rows or more, --prefix >= 1, --own >= 0, --reply >= 2")
    torch.set_num_threads(args.threads)
    model, tokenizer = models.load_policy("smollm2-135m", dtype="auto")
    use_decode_attention(model)
    cells = []
    for batch in args.batches:
        requests = requests_for(batch, args.prefix, args.own, len(tokenizer))
        runs: dict[bool, list[float]] = {True: [], False: []}
        replies: dict[bool, list] = {}
        for repeat in range(args.repeats):
            for share in (True, False) if repeat % 2 == 0 else (False, True):
                took, samples = decode_seconds(model, tokenizer, requests, args.reply, share)
                runs[share].append(took)
                replies[share] = [s.token_ids for s in samples]
        held, copied = statistics.median(runs[True]), statistics.median(runs[False])
        tokens = batch * args.reply
        cell = {
            "batch": batch,
            "held_once_s": round(held, 2),
            "copied_s": round(copied, 2),
            "held_once_tokens_per_s": round(tokens / held, 1),
            "copied_tokens_per_s": round(tokens / copied, 1),
            "speedup": round(copied / held, 2),
            "same_replies": sum(a == b for a, b in zip(replies[True], replies[False], strict=True)),
        }
        cells.append(cell)
        print(
            f"batch {batch:3d}: decode {copied:6.2f} s copied, {held:6.2f} s held once "
            f"({cell['copied_tokens_per_s']:.0f} -> {cell['held_once_tokens_per_s']:.0f} "
            f"tokens/s), {cell['speedup']:.2f}x; same replies {cell['same_replies']}/{batch}",
            flush=True,
        )
    dtype = next(model.parameters()).dtype
    summary = {
        "command": "python -m benchmarks.shared_prefix " + " ".join(sys.argv[1:]),
        "machine": machine(dtype),
        "work": {"prefix": args.prefix, "own": args.own, "reply": args.reply},
        "threads": args.threads,
        "repeats": args.repeats,
        "cells": cells,
    }
    write_summary(args.out, summary)


if __name__ == "__main__":
    main()
