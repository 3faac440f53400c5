"""Training samples of windowed trajectories: one per turn.

With ``rollout.context_window=full`` an episode is one training sample, its whole token row.
With another window a trajectory's ids hold, turn after turn, the context built for the turn
and the reply sampled in it (rollout/window.py), and each turn is a sample of its own:
``ids[context_start:reply_end]``, exactly the ids the model read and wrote, the loss on that
reply alone.

The advantages are estimated on the episodes' rows all the same (``collate``), whose sampled
tokens and turns are those of the samples: so grpo's group statistics take one entry per
episode, gae steps from one turn's reply to the next turn's, and every estimator sees an
episode as it does with the full window. :class:`TurnSamples` moves tensors between the two
layouts: the episodes' (B, T) and the samples' (R, W).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ragen.rollout.trajectory import Batch, Trajectory


@dataclass(frozen=True)
class TurnSamples:
    """Where each of R turn samples lies in the episodes' batch; each (R,) long."""

    episode: Tensor  # the row of the episodes' batch (the trajectory) the sample is from
    start: Tensor  # the position its context starts at in that row
    length: Tensor  # its tokens: context and reply

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory]) -> TurnSamples:
        """The samples of every turn of ``trajectories``, episode by episode, turn by turn.
        An episode that ended before its first reply has none."""
        spans = [
            (b, turn.context_start, turn.reply_end - turn.context_start)
            for b, t in enumerate(trajectories)
            for turn in t.turns
        ]
        columns = list(zip(*spans, strict=True)) if spans else [(), (), ()]
        episode, start, length = (torch.tensor(c, dtype=torch.long) for c in columns)
        return cls(episode, start, length)

    def __len__(self) -> int:
        return len(self.episode)

    def _places(self, width: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """(rows, columns, valid), each (R, width): sample r's j-th token sits at
        ``[rows[r, j], columns[r, j]]`` of the episodes' batch where ``valid[r, j]``."""
        j = torch.arange(width, device=device)
        episode, start, length = (x.to(device) for x in (self.episode, self.start, self.length))
        valid = j < length[:, None]
        columns = torch.where(valid, start[:, None] + j, 0)
        return episode[:, None].expand(-1, width), columns, valid

    def to_samples(self, x: Tensor, fill: float | int = 0) -> Tensor:
        """(B, T) of the episodes → (R, W) of the samples, W their longest, right-padded
        with ``fill``."""
        width = int(self.length.max()) if len(self) else 0
        rows, columns, valid = self._places(width, x.device)
        return torch.where(valid, x[rows, columns], torch.full((), fill, dtype=x.dtype))

    def to_episodes(self, y: Tensor, shape: torch.Size | tuple[int, int]) -> Tensor:
        """(R, W') of the samples → (B, T) ``shape`` of the episodes: each sample's entries
        at their places (a sample's first W' tokens when W' is shorter than it), 0 elsewhere.
        Samples of one episode never overlap, so each place is written once."""
        rows, columns, valid = self._places(y.shape[1], y.device)
        out = torch.zeros(shape, dtype=y.dtype, device=y.device)
        out[rows[valid], columns[valid]] = y[valid]
        return out

    def batch(self, episodes: Batch, pad_id: int) -> Batch:
        """The samples' (R, W) Batch cut from the episodes' ``episodes`` Batch, right-padded
        (ids with ``pad_id``): ids, masks, rewards (as placed in the episode), turn ids and
        log-probs sliced; each sample's episode's score and group."""
        if not len(self):
            raise ValueError(
                "no episode reached its first reply (its opening and rollout.max_reply_tokens "
                "pass rollout.max_context_tokens): raise rollout.max_context_tokens"
            )
        return Batch(
            input_ids=self.to_samples(episodes.input_ids, pad_id),
            attention_mask=self.to_samples(episodes.attention_mask),
            loss_mask=self.to_samples(episodes.loss_mask),
            rewards=self.to_samples(episodes.rewards),
            scores=episodes.scores[self.episode],
            group_ids=episodes.group_ids[self.episode],
            turn_ids=self.to_samples(episodes.turn_ids, -1),
            logprobs=self.to_samples(episodes.logprobs),
        )
