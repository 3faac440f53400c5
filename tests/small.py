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

SOKOBAN_UPDATE = [
    "model.spec=tiny",
    "rollout.groups=2",
    "rollout.group_size=2",
    "rollout.max_turns=2",
    "rollout.max_actions_per_turn=1",
    "rollout.max_reply_tokens=96",
    "rollout.demos=0",
    "algo.filter_ratio=1",
    "trainer.mini_batch_size=4",
    "trainer.micro_batch_size=2",
    "trainer.update_dtype=float32",
    "trainer.eval_every=0",
    "logging.progress=false",
    NO_TENSORBOARD,
]
"""The update tests' Sokoban run (with ``sokoban-rl``): up to two turns of one action, so rows
hold several reply segments; 4 episodes, all kept, in one mini-batch of micro-batches of 2,
in float32."""
