"""Where a decode step's time goes on a GPU: the rollout's own loop against bare forwards.

    python tools/device/profile_decode.py [--device cuda] [--out DIR] [--steps 64]
        [--groups 4] [--group-size 8]

One Sokoban turn of P=``--groups`` × N=``--group-size`` episodes (4 × 8; the paper's step is
8 × 16 with 400 tokens) with replies of up to ``--steps`` tokens, T=1, with the ``hf``
generator, in bf16 where the device runs it:

1. the turn timed with static decode steps (CUDA graphs, the default on a GPU) and with the
   shrinking batch of eager forwards, then the static turn again under cProfile (the top
   functions by own time: DIR/cprofile.txt);
2. the static turn under torch.profiler, CPU and CUDA (the top ops by CPU time:
   DIR/torch_ops.txt), which says how much of a step the GPU is busy;
3. bare decode forwards of a batch of 32 over a preallocated cache, with the rollout's mask
   and without one: the floor that transformers' eager forward sets, without sampling;
4. forwards replayed from a captured CUDA graph over transformers' static cache, at 32 and
   128 rows: the floor of a graph's step.

Prints a table of milliseconds per decode step and writes DIR/profile_decode.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch

from ragen import models
from ragen.config import DTYPES
from ragen.models.kv_keyword import cache_keyword
from ragen.rollout.engines import make_generator
from ragen.rollout.loop import RolloutSpec, rollout


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_turn(
    model, tokenizer, steps: int, seed: int, static: bool, shape: tuple[int, int] = (4, 8)
) -> tuple[float, int]:
    """Seconds and generated tokens of one turn of ``shape`` (groups × copies) Sokoban
    episodes, a fresh generator."""
    groups, copies = shape
    generator = make_generator("hf", model, tokenizer)
    generator.static = static
    spec = RolloutSpec(
        max_turns=1,
        max_actions_per_turn=2,
        max_actions_per_episode=2,
        max_reply_tokens=steps,
        temperature=1.0,
    )
    sync(model.device)
    start = time.perf_counter()
    rollout(generator, tokenizer, "sokoban", list(range(seed, seed + groups)), copies, spec)
    sync(model.device)
    return time.perf_counter() - start, generator.stats.generated_tokens


@torch.inference_mode()
def bare_forwards(model, batch: int, context: int, steps: int, masked: bool) -> float:
    """Milliseconds per decode forward of ``batch`` rows after a ``context``-token prefill."""
    from ragen.rollout.engines.kv_cache import empty_cache  # the generator's own cache

    device = model.device
    cache = empty_cache(model, batch, context + steps + 1)
    ids = torch.randint(100, 1000, (batch, context), device=device)
    mask = torch.ones(batch, context, dtype=torch.long, device=device)
    keyword = cache_keyword(model)
    model(input_ids=ids, attention_mask=mask, **{keyword: cache}, use_cache=True)
    token = ids[:, -1:]
    sync(device)
    start = time.perf_counter()
    for step in range(steps):
        mask = torch.ones(batch, context + step + 1, dtype=torch.long)
        positions = torch.full((batch, 1), context + step)
        model(
            input_ids=token,
            attention_mask=mask.to(device) if masked else None,
            position_ids=positions.to(device),
            **{keyword: cache},
            use_cache=True,
        )
    sync(device)
    return 1000 * (time.perf_counter() - start) / steps


@torch.inference_mode()
def graph_forwards(model, batch: int, context: int, steps: int) -> float:
    """Milliseconds per decode forward replayed from one CUDA graph over a StaticCache."""
    from transformers import StaticCache

    device, keyword = model.device, cache_keyword(model)
    cache = StaticCache(config=model.config, max_cache_len=context + steps + 8)
    ids = torch.randint(100, 1000, (batch, context), device=device)
    model(
        input_ids=ids,
        **{keyword: cache},
        cache_position=torch.arange(context, device=device),
        use_cache=True,
    )
    token = ids[:, -1:].clone()
    where = torch.tensor([context], device=device)
    positions = torch.full((batch, 1), context, device=device)

    def step():
        return model(
            input_ids=token,
            position_ids=positions,
            **{keyword: cache},
            cache_position=where,
            use_cache=True,
        ).logits

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up outside the graph, as capture requires
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    sync(device)
    start = time.perf_counter()
    for n in range(steps):
        where.fill_(context + 1 + n)
        positions.fill_(context + 1 + n)
        graph.replay()
    sync(device)
    return 1000 * (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto", choices=DTYPES)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--out", default=".")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    shape = (args.groups, args.group_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = models.load_policy("smollm2-135m", dtype=args.dtype, device=args.device)
    device = model.device
    report: dict = {"device": str(device), "dtype": str(next(model.parameters()).dtype)}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    static = device.type == "cuda"
    for name, mode in (("eager", False), ("static", static)):
        one_turn(
            model, tokenizer, 8, seed=100, static=mode, shape=shape
        )  # warm-up: kernels, allocator
        wall, tokens = one_turn(model, tokenizer, args.steps, seed=0, static=mode, shape=shape)
        report[f"turn_{name}_s"], report[f"turn_{name}_tokens"] = round(wall, 3), tokens
        report[f"turn_{name}_ms_per_step"] = round(1000 * wall / args.steps, 2)
    cpu0 = time.process_time()
    profile = cProfile.Profile()
    profile.enable()
    one_turn(model, tokenizer, args.steps, seed=0, static=static, shape=shape)
    profile.disable()
    report["turn_cpu_s"] = round(time.process_time() - cpu0, 3)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(40)
    (out / "cprofile.txt").write_text(text.getvalue())
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        one_turn(model, tokenizer, args.steps, seed=0, static=static, shape=shape)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    (out / "torch_ops.txt").write_text(table)
    events = prof.key_averages()
    report["profiled_cpu_ms"] = round(sum(e.self_cpu_time_total for e in events) / 1000, 1)
    if device.type == "cuda":
        report["profiled_gpu_ms"] = round(sum(e.self_device_time_total for e in events) / 1000, 1)
    context = 300
    report["bare_masked_ms"] = round(bare_forwards(model, 32, context, args.steps, True), 2)
    report["bare_unmasked_ms"] = round(bare_forwards(model, 32, context, args.steps, False), 2)
    if device.type == "cuda":
        try:
            for rows in (32, 128):
                ms = graph_forwards(model, rows, context, args.steps)
                report[f"graph_{rows}_rows_ms"] = round(ms, 2)
        except Exception as err:  # an experiment: what fails is part of the answer
            report["graph_error"] = f"{type(err).__name__}: {err}"[:400]
    for key, value in report.items():
        print(f"{key:<20} {value}")
    (out / "profile_decode.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
