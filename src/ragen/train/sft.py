"""Supervised fine-tuning on expert dialogues: the cold start before RL (`ragen sft`).

Each step plays fresh levels with the env's expert through the rollout loop
(`rollout.expert`), so a dialogue is token for token what a rollout of the model would be
(same prompts, worked examples, turn messages and stop), and its ``loss_mask`` is the one an
RL update would use. The loss is the token-mean negative log-likelihood of the reply tokens.

The run loop (loop.py) drives this step as it drives the RL one: the same run directory,
metrics.jsonl, trajectories, evaluations, checkpoints (the policy in the Hugging Face layout,
LoRA merged, so ``ragen train PRESET model.spec=RUN/checkpoints/step_N`` starts RL from it)
and exact resume (a step's levels depend only on ``(trainer.seed, step)``).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext

import torch

from ragen import metric_names as names
from ragen.config import Config, ConfigError
from ragen.host.memory import trim_heap
from ragen.rollout.expert import expert_dialogues, expert_seeds
from ragen.rollout.loop import RolloutSpec
from ragen.rollout.samples import TurnSamples
from ragen.rollout.trajectory import Batch, Trajectory, collate
from ragen.train import setup
from ragen.train.cuda import deterministic_attention, gpu_memory_metrics
from ragen.train.forward import SharedOpening, token_logprobs
from ragen.train.schedule import set_sft_learning_rate
from ragen.train.state import RunState

# With keep=solved, levels tried per step at most this many times sft.dialogues: the
# expert solves most levels, so running out means a budget too small for the game.
MAX_LEVELS_PER_DIALOGUE = 8


def supervised_update(
    policy,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    *,
    micro_batch_size: int,
    grad_clip: float,
    autocast_dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """One optimiser step of ``policy`` (a causal LM, LoRA-wrapped or not) on the token-mean
    NLL of ``batch``'s reply tokens.

    batch: (B, T) right-padded tensors from `collate`; only positions with ``loss_mask`` 1
    are scored. Micro-batches of ``micro_batch_size`` rows accumulate gradients, each scaled
    by the batch's total reply tokens, so the step equals one pass over the whole batch. A
    non-finite gradient norm skips the step (the weights stay as they were).

    ``autocast_dtype``: the forwards run under autocast to it (trainer.update_dtype; None:
    in the weights' dtype), as the RL update's do. The opening every row shares runs once for
    the whole batch and its backward once after the last micro-batch (``SharedOpening``),
    instead of once per micro-batch.
    """
    device = next(policy.parameters()).device
    tokens = float(batch.loss_mask.sum())
    if tokens == 0:
        raise ValueError("a supervised batch needs reply tokens to train on")
    policy.train()
    autocast = (
        nullcontext()
        if autocast_dtype is None
        else torch.autocast(device.type, dtype=autocast_dtype)
    )
    with autocast:
        opening = SharedOpening(
            policy.get_decoder(), batch.input_ids.to(device), batch.attention_mask.to(device)
        )
    total = 0.0
    for start in range(0, len(batch.input_ids), micro_batch_size):
        rows = slice(start, start + micro_batch_size)
        loss_mask = batch.loss_mask[rows].to(device)
        with autocast:
            logp, _ = token_logprobs(
                policy,
                batch.input_ids[rows].to(device),
                batch.attention_mask[rows].to(device),
                loss_mask,
                with_entropy=False,
                opening=opening,
            )
            nll = -(logp * loss_mask).sum()
        (nll / tokens).backward()
        total += float(nll.detach())
    opening.backward()
    params = [p for p in policy.parameters() if p.requires_grad]
    norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    skipped = not math.isfinite(norm)
    if not skipped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    policy.eval()
    return {
        names.SFT_LOSS: total / tokens,
        names.SFT_GRAD_NORM: norm,
        "sft/skipped": float(skipped),
        "sft/reply_tokens": tokens,
    }


class SftTrainer:
    """`ragen sft`: the policy (LoRA if asked), its AdamW at sft.lr, and a supervised step on
    expert dialogues; ``loop.RunLoop`` runs it with the RL trainer's run directory,
    checkpoints, resume and evaluations. One process (no torchrun). Building one loads the
    model and writes nothing."""

    name = "sft"
    watched = False  # the collapse detector reads RL metrics, which this loop has none of

    def __init__(self, config: Config) -> None:
        self.config = config
        self.device = setup.start(config)
        self.m = setup.build_policy(config, self.device, config.sft.lr)
        self.sampler, self.generator = setup.sampling(config, self.m, self.device)
        self.spec = RolloutSpec.from_config(config.rollout)
        self.update_dtype = setup.update_dtype(config, self.device)

    @property
    def steps(self) -> int:
        return self.config.sft.steps

    def evaluates(self, step: int, last: bool) -> bool:
        every = self.config.sft.eval_every
        return last or (every > 0 and (step + 1) % every == 0)

    def progress(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"loss": f"{metrics['sft/loss']:.3f}"}

    def dialogues(self, step: int) -> tuple[list[Trajectory], int]:
        """The step's expert dialogues (``sft.dialogues`` of them when the levels allow) and
        how many levels were played to find them."""
        c, want = self.config, self.config.sft.dialogues
        limit = want * (MAX_LEVELS_PER_DIALOGUE if c.sft.keep == "solved" else 1)
        seeds = expert_seeds(c.trainer.seed, step, limit)
        kept: list[Trajectory] = []
        played = 0
        while len(kept) < want and played < limit:
            chunk = seeds[played : played + want - len(kept)]
            played += len(chunk)
            for dialogue in expert_dialogues(
                self.m.tokenizer,
                c.env.name,
                chunk,
                self.spec,
                env_options=c.env.options,
                thought=c.sft.thought,
                lake=c.sft.lake_expert,
                sokoban=c.sft.sokoban_expert,
            ):
                if c.sft.keep == "all" or dialogue.success:
                    kept.append(dialogue)
        if not kept:
            raise ConfigError(
                f"config: the expert solved none of {played} levels of {c.env.name} within "
                f"rollout.max_actions_per_episode={c.rollout.max_actions_per_episode}: raise "
                "it, or set sft.keep=all"
            )
        for number, dialogue in enumerate(kept):  # numbered as the groups of a rollout
            dialogue.group = number
        return kept, played

    def batch(self, dialogues: list[Trajectory]) -> Batch:
        """The step's dialogues as one right-padded batch, shortest first: rows of similar
        length share a micro-batch, so less padding is computed. With a context window other
        than full, the rows are their turn samples (rollout/samples.py), as RL trains."""
        by_length = sorted(dialogues, key=lambda d: len(d.token_ids))
        batch = collate(by_length, self.m.tokenizer.pad_token_id)
        if self.spec.context_window == "full":
            return batch
        return TurnSamples.of(by_length).batch(batch, self.m.tokenizer.pad_token_id)

    def step(self, step: int, state: RunState) -> tuple[dict[str, float], list[Trajectory]]:
        """One supervised step on fresh expert dialogues: its metrics and the dialogues."""
        c = self.config
        lr = set_sft_learning_rate(self.m.optimizers["actor"], c, step)
        started = time.perf_counter()
        dialogues, played = self.dialogues(step)
        metrics = {
            "time/dialogues_s": time.perf_counter() - started,
            "sft/dialogues": float(len(dialogues)),
            "sft/levels_played": float(played),
            "sft/expert_success": sum(d.success for d in dialogues) / len(dialogues),
            "sft/turns_mean": sum(len(d.turns) for d in dialogues) / len(dialogues),
            "sft/lr": lr,
            "perf/threads": float(torch.get_num_threads()),
        }
        started = time.perf_counter()
        batch = self.batch(dialogues)
        with deterministic_attention(self.device, c.trainer.deterministic):
            metrics.update(
                supervised_update(
                    self.m.policy,
                    self.m.optimizers["actor"],
                    batch,
                    micro_batch_size=c.sft.micro_batch_size,
                    grad_clip=c.trainer.grad_clip,
                    autocast_dtype=self.update_dtype,
                )
            )
        metrics.update(gpu_memory_metrics(self.device))
        metrics["time/update_s"] = time.perf_counter() - started
        state.note_skipped(step, metrics["sft/skipped"] == 1.0, "sft.lr")
        # As after an RL update: glibc keeps the freed activations unless asked, and an
        # evaluation allocating beside them can run out of memory.
        trim_heap()
        metrics["perf/train_tokens_per_s"] = float(batch.attention_mask.sum()) / max(
            metrics["time/update_s"], 1e-9
        )
        return metrics, dialogues
