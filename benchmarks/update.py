"""One PPO update step (policy + critic) on the embedded model, as model-FLOPs utilisation.

    python -m benchmarks.update [--preset bandit] [--set KEY=VALUE ...] [--repeats 1]
        [--ref-micro-batch 2] [--threads 1] [--out benchmarks/results/update.json]

The batch is real: the Trainer's own stages collect one rollout of the preset (Bandit: 8
groups × 4 copies, two worked turns in the prompt, replies up to 64 tokens) with the embedded
model and filter it. Each path then scores the rows and updates on them:

- ``ragen``: the Trainer's own ``prepare`` (which scores nothing when the update is exactly
  on-policy: it takes old log-probs from its forward and trains the critic first), then the
  real ``ppo_update`` (policy and critic forward + backward, grad clipping, AdamW steps)
  with its training forward: the rows' shared prompt prefix runs once per micro-batch and
  the LM head runs only where a sampled token is scored;
- ``plain``: a scoring pass of full forwards (old log-probs, values; the same estimator and
  whitening), then the same losses (``ragen.algos``) and optimiser steps through a plain
  ``transformers`` forward/backward: full (B, T, V) logits, ``log_softmax``, gather, entropy
  over the vocabulary, the critic over every row in full; under the same autocast.

The updates take turns, so that load from others on a shared machine falls on both; the
speedup compares score + update on each side.

and, in the same run, the machine's matmul peak: the best fp32 GEMM over a square 2048 one
and the model's own MLP shapes, and a bf16 GEMM (emulated on CPUs without AVX512-BF16/AMX,
where it is far below fp32: MFU against it is reported, but means nothing there). GEMMs are
timed by the process's CPU clock, so the peak is what one thread does while it runs.

FLOPs are counted as ``measure.py`` says (backward = 2 × forward). Two token counts are
reported:
- useful tokens: every real token of every row (what the batch means; padding excluded);
- computed tokens: what ragen actually runs: the shared prefix once per micro-batch, then
  each row's own tokens (padding excluded).
"MFU" divides the FLOPs a path actually needs for the tokens it computes by its wall time and
the peak of the update's dtype (bf16 under bf16 autocast, else fp32; the JSON holds both)
("cpu time": by its CPU seconds instead, which on a shared machine leaves out
the time others held the core); "effective MFU" credits ragen with the useful tokens' FLOPs
(no prefix sharing, head on sampled positions only), i.e. its speed expressed as if it had
done that work. Timings are the best of ``--repeats`` (all are kept in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.measure import (
    add_counts,
    chunk_counts,
    critic_share,
    flops,
    machine,
    matmul_peak,
    model_shape,
    scored_models,
    timed,
    update_chunks,
)
from ragen import config, models
from ragen.algos import aggregate, policy_loss, value_loss
from ragen.rollout.trajectory import collate
from ragen.train import setup
from ragen.train.trainer import Trainer, batch_advantages
from ragen.train.update import UpdateData

GOAL_MFU_BF16 = 0.5  # issue 5: >= 50% of the bf16 matmul peak
QUIET = ["logging.tensorboard=false", "logging.progress=false", "logging.save_trajectories=false"]


# ---------------------------------------------------------------------------- the two paths


def _plain_logprobs(policy, ids, mask, temperature: float):
    """Log-probs and entropies (B, T) from full (B, T, V) logits: token t given < t."""
    logits = policy(input_ids=ids, attention_mask=mask).logits
    logp_all = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)  # (B, T-1, V)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return F.pad(logp, (1, 0)), F.pad(entropy, (1, 0))


def _plain_values(critic, ids, mask):
    """V(state before token t), (B, T): the critic's body over every token, then its head."""
    hidden = critic.body(input_ids=ids, attention_mask=mask).last_hidden_state
    return F.pad(critic.head(hidden.float()).squeeze(-1)[:, :-1], (1, 0))


def _plain_micro(policy, critic, part: UpdateData, a, temperature: float, norm: float):
    """Loss of one micro-batch through plain transformers calls: full logits, no sharing."""
    mask = part.loss_mask
    logp, entropy = _plain_logprobs(policy, part.input_ids, part.attention_mask, temperature)
    pg_tok, _ = policy_loss(
        logp, part.old_logprobs, part.advantages, mask, a.clip_low, a.clip_high, a.dual_clip
    )
    actor = aggregate(pg_tok, mask, a.aggregation(), norm) - a.entropy_coef * aggregate(
        entropy, mask, a.aggregation(), norm
    )
    values = _plain_values(critic, part.input_ids, part.attention_mask)
    v_tok, _ = value_loss(values, part.old_values, part.returns, mask, a.value_clip)
    return actor + aggregate(v_tok, mask, a.aggregation(), norm)


@torch.no_grad()
def plain_score(trainer: Trainer, kept: list, micro: int) -> UpdateData:
    """What a plain implementation runs before its update, the rows ragen's update reads:
    old log-probs and values by full forwards of ``micro`` rows at a time, then the
    estimator's advantages, whitened over the batch when the algo whitens."""
    c, m = trainer.config, trainer.m
    batch = collate(kept, m.tokenizer.pad_token_id, c.rollout.reward_placement)
    ids, mask, loss_mask = batch.input_ids, batch.attention_mask, batch.loss_mask
    old, values = [], []
    autocast = setup.autocast(trainer.device, trainer.update_dtype)  # the update's dtype
    for rows in torch.arange(len(ids)).split(micro):
        with autocast:
            old.append(_plain_logprobs(m.policy, ids[rows], mask[rows], _temperature(trainer))[0])
            values.append(_plain_values(m.critic, ids[rows], mask[rows]))
    old_values = torch.cat(values)
    advantages, returns = batch_advantages(
        c.algo,
        rewards=batch.rewards,
        mask=loss_mask,
        values=old_values,
        scores=batch.scores,
        group_ids=batch.group_ids,
    )
    return UpdateData(
        input_ids=ids,
        attention_mask=mask,
        loss_mask=loss_mask,
        advantages=advantages.float(),
        returns=returns.float(),
        old_logprobs=torch.cat(old),
        ref_logprobs=None,
        old_values=old_values,
    )


def _temperature(trainer: Trainer) -> float:
    return trainer.config.rollout.temperature or 1.0


def plain_update(trainer: Trainer, data: UpdateData, micro: int) -> None:
    """One pass over the rows in the update's mini-batches, micro-batches of ``micro`` rows,
    forwards under the update's autocast, gradient clipping and AdamW steps as in
    ``ppo_update``."""
    c, m = trainer.config, trainer.m
    policy, critic = m.policy.train(), m.critic
    autocast = setup.autocast(trainer.device, trainer.update_dtype)  # the update's dtype
    for rows in torch.arange(len(data.input_ids)).split(c.trainer.mini_batch_size):
        mini_data = data.rows(rows)
        norm = float(mini_data.loss_mask.sum())
        for opt in m.optimizers.values():
            opt.zero_grad(set_to_none=True)
        for part in torch.arange(len(rows)).split(micro):
            with autocast:
                loss = _plain_micro(
                    policy, critic, mini_data.rows(part), c.algo, _temperature(trainer), norm
                )
            loss.backward()
        for model in (policy, critic):
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.trainer.grad_clip)
        for opt in m.optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
    policy.eval()


# ---------------------------------------------------------------------------- report


def row(timing: dict, useful: int, computed: int, model_flops: float, peak: dict) -> dict:
    """Speed of one path: tokens/s, model GFLOP/s and MFU against both peaks, by the wall
    clock and by the process's CPU clock (what it got of its core on a shared machine)."""
    seconds, cpu = timing["wall_s"], timing["cpu_s"]
    # a pass that ran nothing (ragen's scoring when the update takes all from its forward)
    rate = model_flops / seconds / 1e9 if seconds else 0.0
    cpu_rate = model_flops / cpu / 1e9 if cpu else 0.0
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "useful_tokens_per_s": round(useful / seconds, 1) if seconds else 0.0,
        "computed_tokens_per_s": round(computed / seconds, 1) if seconds else 0.0,
        "model_gflop": round(model_flops / 1e9, 1),
        "gflop_per_s": round(rate, 2),
        "mfu_fp32": round(rate / peak["fp32_gflops"], 3),
        "mfu_bf16": round(rate / peak["bf16_gflops"], 3),
        "mfu_fp32_cpu_time": round(cpu_rate / peak["fp32_gflops"], 3),
        "mfu_bf16_cpu_time": round(cpu_rate / peak["bf16_gflops"], 3),
    }


def summarise(runs: dict, counts: dict, shape: dict, peak: dict, decoders: dict) -> dict:
    """The table's rows: best time of each path, with the FLOPs each needs for its tokens.

    ``decoders``: ``trained``, the decoders the update runs (the policy's, and the critic's
    share of it); ``scored``, those ragen's scoring pass runs and whether the LM head is
    among them (``measure.scored_models``)."""
    upd, score = counts["update"], counts["score"]
    best = {name: min(timings, key=lambda t: t["wall_s"]) for name, timings in runs.items()}
    heads, trained = upd["head_positions"], decoders["trained"]
    scored, with_head = decoders["scored"]
    # forward + backward = 3 forwards; policy and critic decoders, the policy's LM head
    ragen = 3 * flops(shape, upd["computed_tokens"], upd["attn_computed"], heads, trained)
    useful = 3 * flops(shape, upd["useful_tokens"], upd["attn_useful"], heads, trained)
    plain = 3 * flops(
        shape, upd["useful_tokens"], upd["attn_useful"], upd["useful_tokens"], trained
    )
    scoring = flops(
        shape,
        score["computed_tokens"],
        score["attn_computed"],
        score["head_positions"] if with_head else 0,
        scored,
    )
    # the plain scoring pass: policy (head on every position) and critic over every token
    plain_scoring = flops(
        shape, score["useful_tokens"], score["attn_useful"], score["useful_tokens"], trained
    )
    rows = {
        "ragen_update": row(
            best["ragen"], upd["useful_tokens"], upd["computed_tokens"], ragen, peak
        ),
        "plain_update": row(best["plain"], upd["useful_tokens"], upd["useful_tokens"], plain, peak),
        "ragen_score": row(
            best["score"], score["useful_tokens"], score["computed_tokens"], scoring, peak
        ),
        "plain_score": row(
            best["plain_score"],
            score["useful_tokens"],
            score["useful_tokens"],
            plain_scoring,
            peak,
        ),
    }
    for dtype in ("fp32", "bf16"):
        rows["ragen_update"][f"effective_mfu_{dtype}"] = round(
            useful / best["ragen"]["wall_s"] / 1e9 / peak[f"{dtype}_gflops"], 3
        )
    return rows


def print_table(rows: dict, speedup: float, peak: dict, dtype: str) -> None:
    """The rows, MFU against the peak of ``dtype`` (fp32 or bf16), the update's dtype."""
    print(
        f"\n{'path':<14} {'seconds':>8} {'useful tok/s':>13} {'computed tok/s':>15} "
        f"{'GFLOP':>8} {'GFLOP/s':>8} {'MFU ' + dtype:>9} {'(cpu time)':>10}"
    )
    for name, r in rows.items():
        print(
            f"{name:<14} {r['seconds']:>8.1f} {r['useful_tokens_per_s']:>13.1f} "
            f"{r['computed_tokens_per_s']:>15.1f} {r['model_gflop']:>8.1f} "
            f"{r['gflop_per_s']:>8.2f} {r[f'mfu_{dtype}']:>9.1%} "
            f"{r[f'mfu_{dtype}_cpu_time']:>10.1%}"
        )
    print(
        f"matmul peak: fp32 {peak['fp32_gflops']:.1f} GFLOP/s, bf16 {peak['bf16_gflops']:.2f} "
        f"GFLOP/s; ragen update effective MFU (useful tokens) "
        f"{rows['ragen_update'][f'effective_mfu_{dtype}']:.1%} of {dtype}; "
        f"speedup over plain transformers (score + update) {speedup:.2f}x"
    )


def peak_dtype(update_dtype: torch.dtype) -> str:
    """The peak an update in ``update_dtype`` is read against: bf16's for bf16 autocast, else
    fp32's (float16 autocast runs no faster than fp32 on a CPU)."""
    return "bf16" if update_dtype == torch.bfloat16 else "fp32"


# ---------------------------------------------------------------------------- main


def collect_batch(trainer: Trainer) -> tuple[list, dict]:
    """One real rollout through the Trainer's stages: collect, filter."""
    started = time.perf_counter()
    trajectories = trainer.collect(0)
    kept, _ = trainer.filter(trajectories)
    info = {
        "episodes": len(trajectories),
        "kept_episodes": len(kept),
        "rollout_s": round(time.perf_counter() - started, 2),
        "reply_tokens_mean": round(sum(sum(t.loss_mask) for t in kept) / len(kept), 1),
        "tokens_per_row_mean": round(sum(len(t.token_ids) for t in kept) / len(kept), 1),
    }
    return kept, info


def count_work(trainer: Trainer, data: UpdateData) -> dict:
    t = trainer.config.trainer
    chunks = update_chunks(data, t.ppo_epochs, t.mini_batch_size, t.micro_batch_size, t.seed)
    update = add_counts([chunk_counts(p.input_ids, p.attention_mask, p.loss_mask) for p in chunks])
    score = add_counts(
        [
            chunk_counts(data.input_ids[r], data.attention_mask[r], data.loss_mask[r])
            for r in torch.arange(len(data.input_ids)).split(t.micro_batch_size)
        ]
    )
    return {"update": update, "score": score}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="bandit")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override"
    )
    parser.add_argument("--repeats", type=int, default=1, help="timings per path (best kept)")
    parser.add_argument(
        "--ref-micro-batch",
        type=int,
        default=2,
        help="rows per plain forward: its full (rows, T, V) logits and their softmax take "
        "~0.2 GB per row here, so a plain loop micro-batches on a shared 24 GB machine",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for every measurement (1 on a shared 2-core machine)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/update.json"))
    return parser.parse_args()


@contextmanager
def collected(preset: str, overrides: list[str]):
    """A Trainer of ``preset`` (quiet, monitor off, ``overrides`` last), with the machine's
    description and one real rollout collected and filtered: yields (trainer, machine
    description, kept trajectories, rollout figures)."""
    cfg = config.load(preset, [*QUIET, "monitor.enabled=false", *overrides])
    if cfg.model.critic_body != "copy":
        # the plain reference trains a critic of its own; `benchmarks/step.py` times this one
        raise SystemExit(
            "update.py: model.critic_body=policy has no plain reference here; "
            "time it with benchmarks/step.py"
        )
    trainer = Trainer(cfg)
    desc = machine(next(trainer.m.policy.parameters()).dtype)
    kept, batch = collect_batch(trainer)
    print(f"rollout: {batch}", flush=True)
    yield trainer, desc, kept, batch


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    with collected(args.preset, args.set) as (trainer, desc, kept, batch):
        cfg = trainer.config
        data, took = timed(lambda: trainer.prepare(kept))
        plain_data, plain_took = timed(lambda: plain_score(trainer, kept, args.ref_micro_batch))
        runs: dict[str, list] = {
            "ragen": [],
            "plain": [],
            "score": [took],
            "plain_score": [plain_took],
        }
        for repeat in range(args.repeats):
            runs["ragen"].append(timed(lambda: trainer.update(data, 0))[1])
            runs["plain"].append(
                timed(lambda: plain_update(trainer, plain_data, args.ref_micro_batch))[1]
            )
            print(
                f"repeat {repeat + 1}: ragen {runs['ragen'][-1]}, plain {runs['plain'][-1]}",
                flush=True,
            )
        shape = model_shape(trainer.m.policy)
        counts = count_work(trainer, data)
        decoders = {
            "trained": 1 + critic_share(trainer),
            "scored": scored_models(trainer, len(kept)),
        }
    tokens = min(1024, counts["update"]["computed_tokens"])
    peak = matmul_peak(shape, tokens)
    desc["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    rows = summarise(runs, counts, shape, peak, decoders)
    # the work of the step on each side: its scoring (ragen's may be none, on-policy), then
    # its update
    speedup = (rows["plain_score"]["seconds"] + rows["plain_update"]["seconds"]) / (
        rows["ragen_score"]["seconds"] + rows["ragen_update"]["seconds"]
    )
    update_dtype = models.resolve_dtype(cfg.trainer.update_dtype)
    print_table(rows, speedup, peak, peak_dtype(update_dtype))
    report = {
        "command": "python -m benchmarks.update "
        + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "set")
        )
        + "".join(f" --set {s}" for s in args.set),
        "machine": desc,
        "workload": {
            "preset": args.preset,
            "overrides": args.set,
            "estimator": cfg.algo.estimator,
            "update_dtype": str(update_dtype).removeprefix("torch."),
            "mini_batch_size": cfg.trainer.mini_batch_size,
            "micro_batch_size": cfg.trainer.micro_batch_size,
            "ref_micro_batch": args.ref_micro_batch,
            **batch,
        },
        "model": shape,
        "counts": counts,
        "flop_counting": FLOP_COUNTING,
        "matmul_peak": peak,
        "timings": runs,
        "paths": rows,
        "speedup_vs_plain": round(speedup, 2),
        "goal_mfu_bf16": GOAL_MFU_BF16,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


FLOP_COUNTING = (
    "forward FLOPs per token = 2*n_body (decoder layers, no embedding) + "
    "4*layers*attn_width*(t+1) (causal attention at position t) per decoder, plus 2*hidden*vocab "
    "where the LM head runs; forward+backward = 3x forward; the critic's scalar head is left out. "
    "A critic cut to some layers (model.critic_layers) counts as that share of a decoder. "
    "ragen_update: policy + critic over the computed tokens (the shared prefix counted once per "
    "micro-batch, padding excluded), LM head on sampled positions only. plain_update: both "
    "decoders over every real token and the LM head on every real position. ragen_score: the "
    "no-grad scoring before the update, of what the update does not take from its own forward "
    "(none when it is exactly on-policy), 1x forward. plain_score: old log-probs and values by "
    "full forwards of every real token, 1x forward. effective_mfu_fp32 credits ragen_update "
    "with the useful tokens' FLOPs (no prefix sharing, head on sampled positions). Padding "
    "tokens are computed by both paths but never counted as model FLOPs."
)


if __name__ == "__main__":
    main()
