"""benchmarks/update.py's plain path: its scoring gives ragen's rows, and its update trains."""

import copy

import torch
from tests.small import TINY_RL

from benchmarks import update

TINY = [
    *TINY_RL,
    "rollout.demos=0",  # short rows: the plain path's full (B, T, V) logits grow with T
    "algo.filter_ratio=1",
    "trainer.mini_batch_size=8",
    "trainer.update_dtype=float32",
]


def test_the_plain_scoring_gives_the_rows_ragen_scores_and_the_plain_update_trains():
    with update.collected("bandit", TINY) as run:
        trainer, _, kept, _ = run
        trainer.on_policy = lambda kept: False  # a scoring pass before the update
        torch.nn.init.normal_(trainer.m.critic.head.weight, std=0.1)  # values other than 0
        ragen = trainer.prepare(kept)  # a full scoring pass: every field filled
        plain = update.plain_score(trainer, kept, micro=3)
        on = ragen.loss_mask > 0
        assert on.sum() > 0 and ragen.old_values[on].abs().min() > 0
        for field in ("old_logprobs", "old_values", "advantages", "returns"):
            got, want = getattr(plain, field), getattr(ragen, field)
            torch.testing.assert_close(got[on], want[on], atol=1e-4, rtol=1e-4)
        before = copy.deepcopy(trainer.m.policy.state_dict())
        update.plain_update(trainer, plain, micro=3)
        after = trainer.m.policy.state_dict()
        assert all(torch.isfinite(after[k]).all() for k in after)
        assert any(not torch.equal(before[k], after[k]) for k in before)
