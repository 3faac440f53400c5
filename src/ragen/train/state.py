"""What a run carries from one step to the next besides its weights: the counters its
checkpoints keep, and whether (and why) it stops.

The run loop (loop.py) owns one ``RunState`` and hands it to each step; a step reads the
rollback count and records the steps it could not learn from.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragen.train.distributed import say

NONFINITE_STOP_STEPS = 3
"""Steps in a row whose every update is skipped for a non-finite loss or gradient after
which a run stops: a learning rate that large never trains again."""


@dataclass
class RunState:
    """The run's counters; ``saved`` is what a checkpoint keeps of them."""

    rollbacks: int = 0  # monitor rollbacks so far: each cuts the learning rates
    # mean eval success of the weights as they stand; None once they change unevaluated, so a
    # checkpoint (the rollback's choice) only ever carries its own weights' figure
    eval_success: float | None = None
    empty_steps: int = 0  # steps in a row whose filter kept no group
    skipped_steps: int = 0  # steps in a row whose every update was skipped (not finite)
    seconds: float = 0.0  # training time up to the last checkpoint (trainer.max_minutes)
    stopped_at: int | None = None  # the last step, when the run ends before trainer.steps
    stop_reason: str | None = None  # why it ends there
    diverged: str | None = None  # why the run stopped on non-finite updates

    def saved(self) -> dict:
        """The counters a checkpoint keeps, so a resumed run goes on as this one would."""
        stopped = None if self.stopped_at is None else [self.stopped_at, self.stop_reason]
        return {
            "rollbacks": self.rollbacks,
            "eval_success": self.eval_success,
            "empty_steps": self.empty_steps,
            "skipped_steps": self.skipped_steps,
            "seconds": self.seconds,
            "stopped": stopped,
        }

    def restore(self, state: dict) -> None:
        """Take the counters back from a checkpoint's state (``saved``; absent keys: 0). A
        run that had stopped is resumed on purpose: it trains on, and only says so."""
        self.rollbacks = int(state.get("rollbacks", 0))
        self.eval_success = state.get("eval_success")
        self.empty_steps = int(state.get("empty_steps", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.seconds = float(state.get("seconds", 0.0))
        stopped = state.get("stopped")
        if isinstance(stopped, list) and len(stopped) == 2:
            say(f"the run had stopped after step {stopped[0]} ({stopped[1]}); it trains on")

    def stop(self, step: int, why: str) -> None:
        """End the run after ``step``, for ``why`` (kept in its checkpoint)."""
        self.stopped_at, self.stop_reason = step, why

    def note_skipped(self, step: int, skipped: bool, lr_key: str) -> None:
        """Count the steps in a row whose every update was skipped because the loss or the
        gradient norm was not finite; at NONFINITE_STOP_STEPS the weights will not move
        again, so the run stops (``diverged`` says why) instead of ending as if trained."""
        self.skipped_steps = self.skipped_steps + 1 if skipped else 0
        if self.skipped_steps < NONFINITE_STOP_STEPS or self.diverged is not None:
            return
        self.diverged = (
            f"[step {step}] every update of the last {self.skipped_steps} steps was skipped: "
            f"the loss or its gradient was not finite (a {lr_key} too large, or weights that "
            "are not finite); start a new run, or resume from a checkpoint before the trouble"
        )
        say(self.diverged)
        self.stop(step, "every update not finite")
