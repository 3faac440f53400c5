"""The metrics logger: each step's metrics to metrics.jsonl, TensorBoard and (if asked) W&B."""

from __future__ import annotations

import time
from collections.abc import Iterable

from ragen.run.jsonl import append_jsonl
from ragen.run.rundir import RunDir


class MetricsLogger:
    """Writes each step's metrics to metrics.jsonl, TensorBoard and (if asked) W&B.

    ``log`` returns only after the line is on disk, so the file always holds every
    completed step.
    """

    def __init__(
        self,
        run: RunDir,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "ragen",
        config: dict | None = None,
    ) -> None:
        self.run = run
        self._tb = None
        self._wandb = None
        if tensorboard:
            # TensorBoard's writer loads only for runs that log to it (a heavy import)
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run.tensorboard))
        if wandb:
            import wandb as wandb_lib  # optional extra; config validation checked it exists

            self._wandb = wandb_lib.init(
                project=wandb_project, dir=str(run.root), name=run.root.name, config=config
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": int(step), "time": round(time.time(), 3), **metrics}
        append_jsonl(self.run.metrics, [record])
        numeric = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def log_episodes(self, step: int, episodes: Iterable[dict]) -> int:
        """Write one step's episodes to trajectories/step_NNNNNN.jsonl."""
        return append_jsonl(self.run.trajectory_file(step), episodes)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
