"""TRL's GRPOTrainer against ragen's GRPO: single-turn Bandit, the embedded model, one run.

    make bench-trl                      # builds .venv-trl (TRL, pinned), then runs:
    .venv/bin/python -m benchmarks.vs_trl [--steps 5] [--trl-prompts chat ragen]
        [--ragen-prompt-steps 2] [--threads 1] [--out benchmarks/results/vs_trl.json]

Both sides train SmolLM2-135M-Instruct (the folder ``ragen.models.prepare`` converts) for
``--steps`` steps of 8 prompts × 4 samples, replies up to 64 tokens at temperature 1, GRPO
advantages (group-normalised), no KL, clip 0.2 / 0.28, AdamW at lr 1e-5, float32 on a CPU
without native bf16 (bf16 autocast only where ``models.bf16_supported()``; on an emulated-
bf16 CPU it is ~100× slower than float32). Each step uses the same Bandit seeds on both
sides (``trainer.step_env_seeds``), so both see the same arm orders and payoff draws.

- ragen: the ``bandit`` preset with ``algo.estimator=grpo`` (two worked turns in the prompt,
  replies primed with ``<think>``, uncertainty filter keeping half the groups), run through
  the Trainer's own stages; generation = ``collect``, update = filter + score + ``ppo_update``.
- TRL: ``GRPOTrainer`` (transformers ``generate``, no vLLM) in its own venv (.venv-trl, run
  as a subprocess of this script), with a reward function that parses each completion with
  ragen's parser and pulls the arm in ragen's Bandit env: env reward, or the format penalty
  (-0.1) when no valid action was written or the reply hit the token limit, exactly as in
  ragen's rollout. Gradient checkpointing (on by default in GRPOConfig) is turned off, as
  ragen does not recompute activations. Prompt variants (``--trl-prompts``):
  ``chat``: ragen's system line and Bandit user message through the chat template, the way a
  TRL user writes a conversational dataset; ``ragen``: ragen's exact opening text (the two
  worked turns and the ``<think>`` prefix) as a plain-text prompt, so both sides compute the
  same prompt tokens (``--ragen-prompt-steps`` steps: each takes minutes on this CPU).
  Generation time is ``_generate_and_score_completions`` (generate, decode, rewards,
  advantages); update time is the rest of the step (forward, backward, optimiser).

Prints a table of seconds per step (generation and update apart), reward, success (the risky,
higher-mean arm pulled), format-ok rate and groups with a non-zero reward spread (GRPO learns
nothing from a group whose rewards are all equal); writes JSON with every step's figures and
``speedup`` = TRL seconds / ragen seconds (per step, generation, update) for each TRL prompt
variant; speeds are means over the steps after the first (first-call allocations).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

GOAL_SPEEDUP = 2.0
STEPS, GROUPS, GROUP_SIZE, MAX_REPLY_TOKENS = 5, 8, 4, 64
TRL_PYTHON = Path(".venv-trl/bin/python")
# The packages .venv-trl is built from (Makefile target bench-trl), recorded in the JSON.
TRL_PACKAGES = ("trl", "transformers", "accelerate", "datasets", "torch")


def machine() -> dict:
    from ragen import models

    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "bf16_native": models.bf16_supported(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def group_signal(rewards: list[float], group_size: int) -> int:
    """Groups whose rewards are not all equal: the only ones GRPO gets a gradient from."""
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    return sum(max(g) > min(g) for g in groups)


# ---------------------------------------------------------------------------- prompts


def bandit_prompts(tokenizer, seeds: list[int]) -> dict:
    """Per seed: the chat prompt (system + user messages) and ragen's opening text and ids."""
    from ragen import envs
    from ragen.agent.prompts import (
        SYSTEM_PROMPT,
        first_user_message,
        reply_prefix,
        worked_reply,
    )
    from ragen.rollout.dialogue import ChatFormat

    fmt = ChatFormat(tokenizer, SYSTEM_PROMPT, reply_prefix(True))
    env = envs.make("bandit")
    demos = []
    for demo in envs.demonstrations(env)[:2]:  # the preset's rollout.demos=2
        user = first_user_message(demo.instructions, env.actions, 1, demo.observation, 1)
        demos += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": worked_reply(demo.thought, demo.answer)},
        ]
    out: dict[str, list] = {"chat": [], "ragen": [], "ragen_ids": []}
    for seed in seeds:
        user = first_user_message(env.instructions(), env.actions, 1, env.reset(seed), 1)
        system = {"role": "system", "content": SYSTEM_PROMPT}
        out["chat"].append([system, {"role": "user", "content": user}])
        messages = [system, *demos, {"role": "user", "content": user}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out["ragen"].append(text + fmt.reply_prefix)
        out["ragen_ids"].append(fmt.opening(user, demos))
    return out


# ---------------------------------------------------------------------------- the TRL side


class BanditReward:
    """A TRL reward function: ragen's parser and Bandit env, ragen's format penalty."""

    __name__ = "bandit"

    def __init__(self, primed: bool, eos_ids: set[int], max_tokens: int) -> None:
        self.primed, self.eos_ids, self.max_tokens = primed, eos_ids, max_tokens
        self.steps: list[dict] = []

    def score(self, text: str, ids: list[int], seed: int) -> tuple[float, bool, bool]:
        """(reward, format_ok, success) of one completion."""
        from ragen import envs
        from ragen.agent.parsing import parse_reply

        env = envs.make("bandit")
        env.reset(seed)
        parsed = parse_reply(("<think>" if self.primed else "") + text, env.actions, 1)
        cut = len(ids) >= self.max_tokens and ids[-1] not in self.eos_ids
        if cut or not parsed.actions:
            return -0.1, False, False
        result = env.step(parsed.actions[0])
        return result.reward, True, bool(result.info["success"])

    def __call__(self, prompts, completions, completion_ids, seed, **_) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        scored = [self.score(t, i, s) for t, i, s in zip(texts, completion_ids, seed, strict=True)]
        rewards = [r for r, _, _ in scored]
        self.steps.append(
            {
                "reward_mean": statistics.fmean(rewards),
                "success": statistics.fmean(s for _, _, s in scored),
                "format_ok": statistics.fmean(f for _, f, _ in scored),
                "reply_tokens": statistics.fmean(len(i) for i in completion_ids),
                "groups_with_signal": group_signal(rewards, GROUP_SIZE),
                "sample_completion": texts[0][:300],
            }
        )
        return rewards


def trl_trainer(job: dict, reward: BanditReward, out_dir: str):
    """A GRPOTrainer whose steps are timed: generation apart from the whole step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    clock: dict[str, list[float]] = {"generation_s": [], "step_s": [], "step_cpu_s": []}

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            clock["generation_s"].append(time.perf_counter() - started)
            return out

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.wall, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            clock["step_s"].append(time.perf_counter() - self.wall)
            clock["step_cpu_s"].append(time.process_time() - self.cpu)

    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    rows = [{"prompt": p, "seed": s} for p, s in zip(job["prompts"], job["seeds"], strict=True)]
    config = GRPOConfig(
        output_dir=out_dir,
        # one generation of 8 prompts x 4 per optimiser step, its update in 4 micro-batches of
        # 8 rows: 32 rows of full logits at once would take ~10 GB with ragen's prompt
        per_device_train_batch_size=GROUPS,
        gradient_accumulation_steps=GROUP_SIZE,
        num_generations=GROUP_SIZE,
        max_completion_length=MAX_REPLY_TOKENS,
        max_steps=job["steps"],
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        weight_decay=0.01,
        max_grad_norm=1.0,
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        temperature=1.0,
        bf16=job["bf16"],
        use_cpu=True,
        activation_checkpointing=False,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=job["seed"],
    )
    trainer = Timed(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    return trainer, clock, tokenizer


def run_trl(job: dict) -> dict:
    """The TRL side (inside .venv-trl): train, return per-step figures."""
    torch.set_num_threads(job["threads"])
    with tempfile.TemporaryDirectory() as tmp:
        reward = BanditReward(job["variant"] == "ragen", set(), MAX_REPLY_TOKENS)
        trainer, clock, tokenizer = trl_trainer(job, reward, tmp)
        reward.eos_ids = {tokenizer.eos_token_id}
        trainer.train()
    if job["variant"] == "ragen":  # plain text, tokenised as TRL does
        prompt_ids = tokenizer(job["prompts"])["input_ids"]
    else:
        prompt_ids = tokenizer.apply_chat_template(
            job["prompts"], add_generation_prompt=True, return_dict=True
        )["input_ids"]
    steps = []
    for i, figures in enumerate(reward.steps):
        generation, total = clock["generation_s"][i], clock["step_s"][i]
        steps.append(
            {
                "step": i,
                "step_s": round(total, 2),
                "step_cpu_s": round(clock["step_cpu_s"][i], 2),
                "generation_s": round(generation, 2),
                "update_s": round(total - generation, 2),
                **figures,
            }
        )
    from importlib.metadata import version

    return {
        "variant": job["variant"],
        "prompt_tokens_mean": round(statistics.fmean(len(ids) for ids in prompt_ids), 1),
        # TRL's prompt ids equal ragen's opening ids (only asked of the "ragen" variant)
        "prompt_ids_match_ragen": prompt_ids == job["ragen_ids"] if job["ragen_ids"] else None,
        "update_rows": GROUPS * GROUP_SIZE,
        "steps": steps,
        "versions": {name: version(name) for name in TRL_PACKAGES},
        "threads": torch.get_num_threads(),
    }


def spawn_trl(job: dict, python: Path) -> dict:
    """Run the TRL side in its own venv; exchange JSON through files."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        env = {**os.environ, "OMP_NUM_THREADS": str(job["threads"])}
        command = [str(python), __file__, "--side", "trl", "--job", str(job_path)]
        subprocess.run([*command, "--result", str(result_path)], check=True, env=env)
        return json.loads(result_path.read_text())


# ---------------------------------------------------------------------------- the ragen side


def ragen_config(args):
    from ragen import config

    overrides = [
        "algo.estimator=grpo",
        f"trainer.steps={args.steps}",
        f"trainer.seed={args.seed}",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "monitor.enabled=false",
        "logging.tensorboard=false",
        "logging.progress=false",
        "logging.save_trajectories=false",
        *args.ragen_set,
    ]
    return config.load("bandit", overrides)


def ragen_step(trainer, step: int) -> dict:
    """One ragen step through the Trainer's stages, generation and update timed apart."""
    from ragen.monitor.metrics import rollout_metrics

    wall, cpu = time.perf_counter(), time.process_time()
    trajectories = trainer.collect(step)
    generation = time.perf_counter() - wall
    kept, _ = trainer.filter(trajectories)
    metrics = trainer.update(trainer.prepare(kept), step)
    total = time.perf_counter() - wall
    rollout = rollout_metrics(trajectories)
    rewards = [t.total_reward for t in trajectories]
    return {
        "step": step,
        "step_s": round(total, 2),
        "step_cpu_s": round(time.process_time() - cpu, 2),
        "generation_s": round(generation, 2),
        "update_s": round(total - generation, 2),
        "reward_mean": statistics.fmean(rewards),
        "success": rollout["rollout/success"],
        "format_ok": rollout["rollout/format_ok"],
        "reply_tokens": rollout["rollout/reply_tokens"],
        "groups_with_signal": group_signal(rewards, trainer.config.rollout.group_size),
        "update_rows": len(kept),
        "pg_loss": metrics.get("actor/pg_loss"),
        "grad_norm": metrics.get("actor/grad_norm"),
        "sample_completion": trajectories[0].turns[0].reply[:300],
    }


def run_ragen(cfg, prompt_ids: list[list[int]]) -> dict:
    from ragen.train.trainer import Trainer

    trainer = Trainer(cfg)
    steps = []
    for step in range(cfg.trainer.steps):
        steps.append(ragen_step(trainer, step))
        if step == 0:
            # the preset's rollout: check that TRL's "ragen" prompts are its very tokens
            same = all(
                t.token_ids[: t.loss_mask.index(1)] == prompt_ids[t.group] for t in trainer.rollouts
            )
        print(f"  ragen step {step}: {_brief(steps[-1])}", flush=True)
    return {
        "variant": "ragen (bandit preset, algo.estimator=grpo)",
        "prompt_tokens_mean": round(statistics.fmean(len(p) for p in prompt_ids), 1),
        "trl_ragen_prompt_is_ragen_opening": same,
        "steps": steps,
    }


# ---------------------------------------------------------------------------- report


def _brief(step: dict) -> str:
    return (
        f"{step['step_s']:.1f} s (gen {step['generation_s']:.1f}, update {step['update_s']:.1f}),"
        f" reward {step['reward_mean']:+.3f}, success {step['success']:.2f}, "
        f"format_ok {step['format_ok']:.2f}, groups with signal {step['groups_with_signal']}"
    )


def summary(side: dict) -> dict:
    """Means over the steps; speed means skip step 0 (first-call allocations) when possible."""
    steps = side["steps"]
    timed = steps[1:] if len(steps) > 1 else steps

    def mean(key: str, rows: list[dict]) -> float:
        return round(statistics.fmean(s[key] for s in rows), 3)

    return {
        **{k: mean(k, timed) for k in ("step_s", "step_cpu_s", "generation_s", "update_s")},
        **{k: mean(k, steps) for k in ("reward_mean", "success", "format_ok", "reply_tokens")},
        "groups_with_signal": mean("groups_with_signal", steps),
        "reward_by_step": [round(s["reward_mean"], 3) for s in steps],
        "success_by_step": [round(s["success"], 3) for s in steps],
    }


def print_table(sides: dict[str, dict]) -> None:
    print(
        f"\n{'side':<12} {'s/step':>7} {'gen s':>7} {'update s':>9} {'cpu s':>7} {'reward':>7} "
        f"{'success':>8} {'format':>7} {'signal':>7}  reward by step"
    )
    for name, s in sides.items():
        print(
            f"{name:<12} {s['step_s']:>7.1f} {s['generation_s']:>7.1f} {s['update_s']:>9.1f} "
            f"{s['step_cpu_s']:>7.1f} {s['reward_mean']:>+7.3f} {s['success']:>8.2f} "
            f"{s['format_ok']:>7.2f} {s['groups_with_signal']:>7.2f}  {s['reward_by_step']}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--trl-prompts", nargs="*", default=["chat", "ragen"], choices=["chat", "ragen"]
    )
    parser.add_argument(
        "--ragen-prompt-steps",
        type=int,
        default=2,
        help="steps for TRL with ragen's prompt (~500 prompt tokens: minutes per step here)",
    )
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON)
    parser.add_argument(
        "--ragen-set", action="append", default=[], metavar="KEY=VALUE", help="ragen override"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads on both sides (1 on a shared box)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/vs_trl.json"))
    parser.add_argument("--side", choices=["both", "trl"], default="both", help=argparse.SUPPRESS)
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def command_line(args) -> str:
    parts = [f"--steps {args.steps}", f"--seed {args.seed}", f"--threads {args.threads}"]
    parts.append("--trl-prompts " + " ".join(args.trl_prompts))
    parts.append(f"--ragen-prompt-steps {args.ragen_prompt_steps}")
    parts += [f"--ragen-set {s}" for s in args.ragen_set]
    return "python -m benchmarks.vs_trl " + " ".join(parts)


def main() -> None:
    args = parse_args()
    if args.side == "trl":
        args.result.write_text(json.dumps(run_trl(json.loads(args.job.read_text()))))
        return
    from ragen import models
    from ragen.train.trainer import step_env_seeds

    torch.set_num_threads(args.threads)
    desc = machine()
    cfg = ragen_config(args)
    folder = str(models.prepare(cfg.model.spec).path)
    tokenizer = models.load_tokenizer(cfg.model.spec)
    seeds = [s for step in range(args.steps) for s in step_env_seeds(args.seed, step, GROUPS)]
    prompts = bandit_prompts(tokenizer, seeds)
    sides, loads = {}, {}
    # TRL first: while its subprocess runs, this process holds no model (memory is shared)
    for variant in args.trl_prompts:
        job = {
            "model": folder,
            "variant": variant,
            "prompts": prompts[variant],
            "seeds": seeds,
            "steps": args.ragen_prompt_steps if variant == "ragen" else args.steps,
            "seed": args.seed,
            "threads": args.threads,
            "bf16": models.bf16_supported(),
            "ragen_ids": prompts["ragen_ids"] if variant == "ragen" else None,
        }
        print(f"trl ({variant} prompt)", flush=True)
        try:
            result = spawn_trl(job, args.trl_python)
        except subprocess.CalledProcessError as err:  # keep the other sides' figures
            print(f"  the TRL side failed ({err}); see its output above", flush=True)
            continue
        for step in result["steps"]:
            print(f"  trl step {step['step']}: {_brief(step)}", flush=True)
        sides[f"trl-{variant}"] = result
        loads[f"trl-{variant}"] = [round(x, 2) for x in os.getloadavg()]
    print("ragen", flush=True)
    sides["ragen"] = run_ragen(cfg, prompts["ragen_ids"])
    loads["ragen"] = [round(x, 2) for x in os.getloadavg()]
    means = {name: summary(sides[name]) for name in ["ragen", *sorted(sides.keys() - {"ragen"})]}
    print_table(means)
    ours = means["ragen"]
    speedup = {
        name: {k: round(m[k] / ours[k], 2) for k in ("step_s", "generation_s", "update_s")}
        for name, m in means.items()
        if name != "ragen"
    }
    print(f"speedup (TRL s/step / ragen s/step): {speedup} (goal >= {GOAL_SPEEDUP})")
    desc["load_average_after"] = loads
    report = {
        "command": command_line(args),
        "machine": desc,
        "workload": {
            "env": "bandit",
            "steps": args.steps,
            "prompts_per_step": GROUPS,
            "samples_per_prompt": GROUP_SIZE,
            "max_reply_tokens": MAX_REPLY_TOKENS,
            "dtype": "bfloat16 autocast" if models.bf16_supported() else "float32",
            "ragen_overrides": args.ragen_set,
            "ragen_filter_ratio": cfg.algo.filter_ratio,
            "ragen_micro_batch_rows": cfg.trainer.micro_batch_size,
            "trl_micro_batch_rows": GROUPS,
            "trl_gradient_checkpointing": False,
        },
        "summary": means,
        "speedup": speedup,
        "goal_speedup": GOAL_SPEEDUP,
        "sides": sides,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
