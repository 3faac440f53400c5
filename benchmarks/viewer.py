"""Viewer responsiveness on a large step: how long the step view's requests take.

    python -m benchmarks.viewer [--episodes 10000] [--out benchmarks/results/viewer.json]

Writes one trajectories file of ``--episodes`` Sokoban episodes (real levels from
``ragen.envs``, 3 turns each, replies of random words about as long as a 96-token reply) into
a temporary run directory, then times the viewer's API through FastAPI's TestClient:

- first page: the first request for the step, which builds the file's index;
- next page: a later page of the same step (index cached);
- filtered: success + end reason + a text search over every reply;
- one episode: the full record of one rollout (a seek and one JSON parse);
- after append: the first page again after 1% more episodes were appended (only the new
  bytes are read).

Warm figures are the median of ``--repeat`` requests. The issue's goal: a step of 10,000
episodes loads in well under a second.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

from ragen import envs
from ragen.run.jsonl import append_jsonl
from ragen.viewer.app import create_app

WORDS = ("box", "target", "push", "wall", "player", "deadlock", "then", "answer", "Up", "Left")
ENDS = ("terminated", "truncated:turns", "truncated:actions", "truncated:reply_length")


def synthetic_episode(rng: random.Random, env, group: int, copy: int, seed: int) -> dict:
    """One episode record in the trainer's format (``Trajectory.to_record``)."""
    observation = env.reset(seed)
    turns = []
    for _ in range(3):
        think = " ".join(rng.choices(WORDS, k=60))
        actions = rng.sample(["Up", "Down", "Left", "Right"], k=2)
        answer = " || ".join(actions)
        turns.append(
            {
                "observation": observation,
                "reply": f"<think>{think}</think><answer>{answer}</answer>",
                "think": think,
                "answer": answer,
                "actions": actions,
                "rewards": [-0.1, -0.1],
                "reward": -0.2,
                "format_ok": True,
                "problems": [],
                "unknown_actions": 0,
                "think_tokens": 70,
            }
        )
    success = rng.random() < 0.2
    return {
        "env": "sokoban",
        "group": group,
        "copy": copy,
        "seed": seed,
        "turns": turns,
        "total_reward": 10.0 if success else -0.6,
        "success": success,
        "end": "terminated" if success else rng.choice(ENDS),
        "num_turns": 3,
        "num_actions": 6,
        "reply_tokens": 240,
        "context_tokens": 900,
    }


def episodes(n: int, group_size: int = 8, start_group: int = 0) -> list[dict]:
    rng = random.Random(n + start_group)
    env = envs.make("sokoban")
    out = []
    for i in range(n):
        group = start_group + i // group_size
        out.append(synthetic_episode(rng, env, group, i % group_size, 1000 + group))
    return out


def timed(client: TestClient, url: str) -> float:
    started = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed


def warm(client: TestClient, url: str, repeat: int) -> float:
    return statistics.median(timed(client, url) for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/viewer.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        path = run / "trajectories" / "step_000000.jsonl"
        records = episodes(args.episodes)
        append_jsonl(path, records)
        size_mb = path.stat().st_size / 1e6
        client = TestClient(create_app(run))
        base = "/api/steps/0/episodes"
        results = {"first page": timed(client, base)}
        results["next page"] = warm(client, f"{base}?offset=5000&limit=100", args.repeat)
        query = "?success=false&end=truncated:turns&q=deadlock%20answer"
        results["filtered"] = warm(client, base + query, args.repeat)
        results["one episode"] = warm(client, f"{base}/{args.episodes // 2}", args.repeat)
        extra = max(1, args.episodes // 100)
        append_jsonl(path, episodes(extra, start_group=args.episodes // 8 + 1))
        results["after append"] = timed(client, base)
        total = client.get(base).json()["total"]
    assert total == args.episodes + extra, total
    print(f"{args.episodes} episodes, {size_mb:.1f} MB; +{extra} appended")
    print(f"{'request':<14} {'ms':>8}")
    for name, seconds in results.items():
        print(f"{name:<14} {seconds * 1000:>8.1f}")
    report = {
        "command": f"python -m benchmarks.viewer --episodes {args.episodes} --repeat {args.repeat}",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "episodes": args.episodes,
        "file_mb": round(size_mb, 1),
        "appended": extra,
        "ms": {name: round(seconds * 1000, 1) for name, seconds in results.items()},
        "goal": "a step of 10,000 episodes loads in well under a second",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
