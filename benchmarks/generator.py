"""Generation backends on a Sokoban-shaped multi-turn workload: the cached path against naive.

    python -m benchmarks.generator [--groups 4] [--copies 8] [--turns 5] [--prompt-tokens 250]
        [--env-tokens 60] [--max-new-tokens 64] [--lora RANK] [--out FILE]

P groups × N copies of the embedded model's chat dialogues (the copies of a group share
their prompt, as in StarPO), every episode running all turns: each turn samples a reply of
up to ``--max-new-tokens`` at temperature 1 and appends an env segment (the turn closed, a
Sokoban observation as a user message, the next assistant header and ``<think>``) of about
``--env-tokens`` tokens. Both backends play the same workload with the same seeds in the same
run, taking turns (naive turn 1, hf turn 1, naive turn 2, ...) so that load from others on
a shared machine falls on both; CPU seconds are reported beside wall seconds for the same
reason. Since each request row has its own noise stream, they sample the same replies except
where float rounding tips a draw, which the ``identical_replies`` figure counts.

Prints a table (wall time, generated tokens/s, prefilled and reused tokens) and writes JSON
with a ``speedup`` field (naive wall time / hf wall time). Goal of the rollout issue: ≥ 3.

``--lora RANK`` compares instead what a LoRA run's rollout decodes with, both on the hf
backend: the policy's adapters kept unmerged in its generation copy (``unmerged``, how
ragen sampled before) against the copy with them merged in (``merged``,
``train/generation_weights.py``); ``speedup`` is then unmerged / merged.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from pathlib import Path

import torch

from ragen import config, envs, models
from ragen.rollout.engines import Request, make_generator
from ragen.train.generation_weights import GenerationWeights, frozen_in

GOAL_SPEEDUP = 3.0


def _fit(tokenizer, head: str, body: str, tail: str, tokens: int) -> list[int]:
    """Ids of head + body + tail with the body cut (or repeated) to make ``tokens`` ids."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in (head, body, tail)]
    room = tokens - len(ids[0]) - len(ids[2])
    filler = ids[1] * (room // max(len(ids[1]), 1) + 1)
    return ids[0] + filler[: max(room, 0)] + ids[2]


def build_workload(tokenizer, args) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Per group: the first prompt's ids, and the env segment's ids for each later turn."""
    prompts, segments = [], []
    for group in range(args.groups):
        env = envs.make("sokoban")
        observation = env.reset(args.seed + group)
        system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        body = f"{env.instructions()}\nThe state:\n{observation}\n"
        tail = (
            "Reply <think>...</think><answer>up to 3 actions separated by ||</answer>."
            "<|im_end|>\n<|im_start|>assistant\n<think>"
        )
        prompts.append(_fit(tokenizer, system, body, tail, args.prompt_tokens))
        turns = []
        for turn in range(args.turns - 1):
            action = env.actions[turn % len(env.actions)]
            result = env.step(action)
            body = f"Reward {result.reward}. The state:\n{result.observation}\nActions left: 9.\n"
            head = "<|im_end|>\n<|im_start|>user\n"
            tail = "<|im_end|>\n<|im_start|>assistant\n<think>"
            turns.append(_fit(tokenizer, head, body, tail, args.env_tokens))
        segments.append(turns)
    return prompts, segments


class Player:
    """One backend playing the workload turn by turn, with its own contexts and clocks."""

    def __init__(self, name: str, model, tokenizer, prompts, segments, args, backend=None):
        self.name, self.segments, self.args = name, segments, args
        self.gen = make_generator(backend or name, model, tokenizer, max_batch=args.max_batch)
        self.contexts = {(g, c): list(p) for g, p in enumerate(prompts) for c in range(args.copies)}
        self.replies: list[list[list[int]]] = []
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def turn(self, turn: int) -> None:
        requests = [Request(key, ids) for key, ids in self.contexts.items()]
        wall, cpu = time.perf_counter(), time.process_time()
        samples = self.gen.generate(
            requests,
            max_new_tokens=self.args.max_new_tokens,
            temperature=self.args.temperature,
            seed=self.args.seed * 7919 + turn,
        )
        self.wall.append(round(time.perf_counter() - wall, 2))
        self.cpu.append(round(time.process_time() - cpu, 2))
        self.replies.append([s.token_ids for s in samples])
        for request, sample in zip(requests, samples, strict=True):
            if turn + 1 < self.args.turns:
                segment = self.segments[request.key[0]][turn]
                self.contexts[request.key] = request.context_ids + sample.token_ids + segment
        print(
            f"  {self.name:8} turn {turn + 1}: {self.wall[-1]:6.1f} s wall, "
            f"{self.cpu[-1]:6.1f} s cpu",
            flush=True,
        )

    def result(self) -> dict:
        self.gen.release(self.contexts)
        stats, wall = self.gen.stats, sum(self.wall)
        return {
            "wall_s": round(wall, 2),
            "cpu_s": round(sum(self.cpu), 2),
            "turn_wall_s": self.wall,
            "turn_cpu_s": self.cpu,
            "generated_tokens": stats.generated_tokens,
            "generated_tokens_per_s": round(stats.generated_tokens / wall, 2),
            "prefilled_tokens": stats.prefilled_tokens,
            "reused_tokens": stats.reused_tokens,
            "replies": self.replies,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=config.DEFAULT_SPEC)
    parser.add_argument("--dtype", default="auto", choices=config.DTYPES)
    parser.add_argument("--groups", type=int, default=4, help="P: distinct prompts")
    parser.add_argument("--copies", type=int, default=8, help="N: copies of each prompt")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=250)
    parser.add_argument("--env-tokens", type=int, default=60)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-batch", type=int, default=None, help="default: fit to memory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", nargs="+", default=["naive", "hf"])
    parser.add_argument(
        "--lora", type=int, default=0, help="rank: LoRA adapters unmerged against merged"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's). Use 1 while others load the machine: with 2 "
        "threads on 2 shared cores, each op waits for a descheduled thread (10x slower here)",
    )
    parser.add_argument(
        "--out", type=Path, help="default: benchmarks/results/generator.json (_lora with --lora)"
    )
    args = parser.parse_args()
    if args.out is None:
        args.out = Path(f"benchmarks/results/generator{'_lora' if args.lora else ''}.json")
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.lora:
        model, tokenizer = models.load_policy(args.model, dtype="float32")  # a master's
        variants = lora_variants(model, args.lora, models.resolve_dtype(args.dtype))
        model = variants["merged"]
    else:
        model, tokenizer = models.load_policy(args.model, dtype=args.dtype)
        variants = dict.fromkeys(args.backends, model)
    prompts, segments = build_workload(tokenizer, args)
    backend = "hf" if args.lora else None
    players = [
        Player(name, m, tokenizer, prompts, segments, args, backend) for name, m in variants.items()
    ]
    # The backends take turns, so a busy spell on this shared machine hits both alike.
    for turn in range(args.turns):
        for player in players:
            player.turn(turn)
    report({p.name: p.result() for p in players}, model, args)


def lora_variants(master, rank: int, dtype: torch.dtype) -> dict[str, torch.nn.Module]:
    """The generation copies of ``master`` with rank-``rank`` adapters on every linear
    layer, in ``dtype``: the adapters unmerged (each layer runs W and then B @ A) and merged
    into W (what GenerationWeights builds)."""
    master = models.apply_lora(master, rank, rank, ["all-linear"])
    unmerged = frozen_in(copy.deepcopy(master), dtype)
    return {"unmerged": unmerged, "merged": GenerationWeights(master, dtype).model}


def report(results: dict, model, args) -> None:
    print(
        f"\n{'backend':8} {'wall s':>8} {'cpu s':>8} {'gen tok/s':>10} {'generated':>10} "
        f"{'prefilled':>10} {'reused':>10}"
    )
    for name, r in results.items():
        print(
            f"{name:8} {r['wall_s']:8.1f} {r['cpu_s']:8.1f} {r['generated_tokens_per_s']:10.1f} "
            f"{r['generated_tokens']:10d} {r['prefilled_tokens']:10d} {r['reused_tokens']:10d}"
        )
    summary = {
        "workload": {k: v for k, v in vars(args).items() if k not in ("out", "backends")},
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "bf16_native": models.bf16_supported(),
        },
        "backends": {n: {k: v for k, v in r.items() if k != "replies"} for n, r in results.items()},
    }
    slow, fast = ("unmerged", "merged") if args.lora else ("naive", "hf")
    if {slow, fast} <= results.keys():
        naive, hf = results[slow], results[fast]
        pairs = [
            (a, b)
            for ta, tb in zip(naive["replies"], hf["replies"], strict=True)
            for a, b in zip(ta, tb, strict=True)
        ]
        summary["identical_replies"] = round(sum(a == b for a, b in pairs) / len(pairs), 3)
        summary["speedup"] = round(naive["wall_s"] / hf["wall_s"], 2)
        summary["speedup_cpu"] = round(naive["cpu_s"] / hf["cpu_s"], 2)
        if not args.lora:
            summary["goal_speedup"] = GOAL_SPEEDUP
        print(
            f"\nspeedup {fast} / {slow}: {summary['speedup']:.2f}× wall, "
            f"{summary['speedup_cpu']:.2f}× cpu"
            + ("" if args.lora else f" (goal ≥ {GOAL_SPEEDUP:g}×)")
            + f", identical replies: {summary['identical_replies']:.0%}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
