"""The overrides of the tiny runs that tests start, written once.

``TINY_RL`` is the smallest real RL run: the tiny random model, 4 groups of 2 episodes
whose replies stop at 6 tokens (the random model never closes one), one mini-batch of 4
in micro-batches of 2, no evaluation and no progress bar. A test adds what it checks."""

TINY_RL = [
    "model.spec=tiny",
    "rollout.groups=4",
    "rollout.group_size=2",
    "rollout.max_reply_tokens=6",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2",
    "trainer.eval_every=0",
    "logging.progress=false",
]

NO_TENSORBOARD = "logging.tensorboard=false"
"""The tests that read a run's JSONL files write no TensorBoard events (its writer is slow
to start)."""
