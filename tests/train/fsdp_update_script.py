"""`ragen train`, then one PPO update of a tiny policy and critic, for test_distributed.py.

Under torchrun (``python -m torch.distributed.run --nproc_per_node 2 THIS OUT [TRAIN ARGS]``)
the processes join their group, run ``ragen train TRAIN ARGS`` in it as ``torchrun -m ragen``
would (one launch for both: each launch costs its processes seconds of imports), then shard
the update's models with FSDP2, and rank 0 writes the final weights and the metrics to
``OUT/result.pt``; the test imports ``update`` to compute the same update in one process.
The batch is made to test what an end-to-end run does not reach: mini-batches of 3 and 1
rows split 1+2 and 0+1 over 2 ranks (the ranks pad with passes that do not count, one of
them with no row of its own), and a non-finite advantage in one row, whose mini-batch every
rank skips.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

from ragen import models
from ragen.cli import main
from ragen.config import AlgoConfig, TrainerConfig
from ragen.train import distributed, fsdp
from ragen.train.scoring import policy_logprobs
from ragen.train.update import UpdateData, UpdateSettings, ppo_update

ROWS, WIDTH, VOCAB = 4, 12, 64


def _data(policy) -> UpdateData:
    rng = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (ROWS, WIDTH), generator=rng)
    lengths = torch.tensor([12, 9, 11, 7])
    attention = (torch.arange(WIDTH) < lengths[:, None]).long()  # right padding
    loss_mask = attention.clone()
    loss_mask[:, :4] = 0  # a 4-token prompt, then the sampled reply
    advantages = torch.randn(ROWS, WIDTH, generator=rng) * loss_mask
    advantages[2, 5] = float("nan")
    with torch.no_grad():
        old = policy_logprobs(policy, ids, attention, loss_mask, with_entropy=False)[0]
    return UpdateData(
        input_ids=ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        advantages=advantages,
        returns=torch.randn(ROWS, WIDTH, generator=rng) * loss_mask,
        old_logprobs=old,
        ref_logprobs=None,
        old_values=torch.zeros(ROWS, WIDTH),
    )


def update(sharded: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Weights after the update (whole, on rank 0 when sharded) and its metrics."""
    policy = models.build_tiny(VOCAB, seed=0)
    critic = models.ValueModel(copy.deepcopy(policy))
    data = _data(policy)
    if sharded:
        fsdp.shard(policy)
        fsdp.shard(critic)
    optimizers = {
        "actor": torch.optim.AdamW(policy.parameters(), lr=1e-2),
        "critic": torch.optim.AdamW(critic.parameters(), lr=1e-2),
    }
    settings = UpdateSettings(
        AlgoConfig(clip_low=0.2, clip_high=0.28, value_clip=0.5, entropy_coef=0.01, kl_coef=0.0),
        TrainerConfig(grad_clip=1.0, ppo_epochs=2, mini_batch_size=3, micro_batch_size=1),
        temperature=1.0,
        autocast_dtype=None,
        sharded=sharded,
    )
    metrics = ppo_update(policy, critic, optimizers, data, settings, seed=0)
    if sharded:
        weights = {**fsdp.gather_model_state(policy), **fsdp.gather_model_state(critic)}
    else:
        weights = {**policy.state_dict(), **critic.state_dict()}
    return {k: v.detach().clone() for k, v in weights.items()}, metrics


if __name__ == "__main__":
    torch.set_num_threads(1)
    with distributed.session(torch.device("cpu")):
        if len(sys.argv) > 2 and (status := main(["train", *sys.argv[2:]])) != 0:
            sys.exit(status)
        weights, metrics = update(sharded=True)
        if distributed.is_main():
            torch.save({"weights": weights, "metrics": metrics}, Path(sys.argv[1]) / "result.pt")
