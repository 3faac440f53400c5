"""Episodes as exact token sequences, and their collation into training tensors.

A trajectory holds the token ids the policy saw and produced, in order: the sampled reply
tokens exactly as generated (never re-encoded from text) and the template / environment
tokens appended as ids between them. ``loss_mask`` is 1 on sampled tokens only, so the update
trains exactly what was sampled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

END_REASONS = (
    "terminated",
    "truncated:actions",
    "truncated:turns",
    "truncated:context",
    "truncated:reply_length",
)
RewardPlacement = Literal["last_token", "per_turn"]


@dataclass
class Turn:
    """One reply and what it did. ``reply_start:reply_end`` indexes the sampled tokens,
    ``context_start:reply_start`` the context they were sampled in (in an episode played
    over an API, which keeps no ids: where the server counted them to lie)."""

    observation: str
    reply: str
    think: str
    answer: str
    actions: list[str]
    rewards: list[float]
    reward: float
    format_ok: bool
    problems: list[str]
    unknown_actions: int
    think_tokens: int
    reply_start: int
    reply_end: int
    terms: dict[str, float] = field(default_factory=dict)  # reward by term; sums to reward
    anchor: str | None = None  # the state's key when the env gives one (see envs.anchor)
    # The reply was sampled after token_ids[context_start:reply_start]: the whole dialogue
    # before it (0) with the full context window, else the window built for this turn, which
    # shows the turns from first_shown (1-based) on (rollout/window.py).
    context_start: int = 0
    first_shown: int = 1

    @property
    def anchor_key(self) -> str:
        """The history-free key of the state this turn acted from: turns of a group with
        equal keys form one of GiGPO's anchor groups."""
        return self.observation if self.anchor is None else self.anchor

    @property
    def penalty(self) -> float:
        """The part of ``reward`` that penalises the reply's form, its ``format`` term
        (``rollout.format_penalty``, or ``cut_reply_penalty`` on a cut reply; 0 when the
        record keeps no terms): GiGPO's invalid-action deduction, kept on this turn alone."""
        return self.terms.get("format", 0.0)

    @property
    def sample(self) -> slice:
        """The turn's context and reply in the trajectory's ids: its training sample when the
        context window is not full."""
        return slice(self.context_start, self.reply_end)

    @property
    def reply_tokens(self) -> int:
        """Tokens the model sampled in this reply (what its length limits count)."""
        return self.reply_end - self.reply_start


@dataclass
class Trajectory:
    """One episode. ``token_ids``, ``loss_mask`` and ``logprobs`` have the same length."""

    env: str
    group: int
    copy: int
    seed: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    success: bool = False
    end: str = ""
    # rollout.context_window it was played with: not full, the ids hold each turn's own
    # context and reply in turn, and each turn is a training sample (rollout/samples.py).
    context_window: str = "full"

    @property
    def per_turn(self) -> bool:
        """Whether each turn is its own training sample (a context window other than full)."""
        return self.context_window != "full"

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.turns)

    def append(self, ids: list[int], *, sampled: bool, logprobs: list[float] | None = None) -> None:
        """Extend the sequence: sampled reply tokens (mask 1) or context tokens (mask 0)."""
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def token_rewards(self, placement: RewardPlacement = "last_token") -> list[float]:
        """Rewards per token: the episode return on the last sampled token (``last_token``),
        or each turn's reward on that turn's last sampled token (``per_turn``)."""
        rewards = [0.0] * len(self.token_ids)
        if not self.turns:
            return rewards
        if placement == "last_token":
            rewards[self.turns[-1].reply_end - 1] = self.total_reward
        else:
            for turn in self.turns:  # every reply holds at least one sampled token
                rewards[turn.reply_end - 1] += turn.reward
        return rewards

    @property
    def context_tokens(self) -> int:
        """The tokens the episode's training rows hold. The full window: the dialogue's
        length, at least to where its last reply ended (an episode played over an API holds
        no ids, only the server's counts). Another window: its turn samples' together; a
        window opened after the last reply, which no reply followed, is none of them."""
        if self.per_turn:
            return sum(turn.reply_end - turn.context_start for turn in self.turns)
        end = self.turns[-1].reply_end if self.turns else 0
        return max(len(self.token_ids), end)

    def to_record(self) -> dict:
        """The JSONL episode record (no token ids: those stay in memory for the update).

        With a context window other than full, it names the window, and each turn the first
        turn its context showed (``first_shown``). Its token counts are read from the turns'
        offsets, so an episode played over an API, which holds no token ids, reports the
        server's counts: ``reply_tokens`` the sampled tokens, ``context_tokens`` as
        `context_tokens` counts them."""
        window = {"context_window": self.context_window} if self.per_turn else {}
        return {
            "env": self.env,
            "group": self.group,
            "copy": self.copy,
            "seed": self.seed,
            **window,
            "turns": [_turn_record(t, self.per_turn) for t in self.turns],
            "total_reward": self.total_reward,
            "success": self.success,
            "end": self.end,
            "num_turns": len(self.turns),
            "num_actions": sum(len(t.actions) for t in self.turns),
            "reply_tokens": sum(t.reply_tokens for t in self.turns),
            "context_tokens": self.context_tokens,
        }


def _turn_record(turn: Turn, windowed: bool) -> dict:
    """A turn as the JSONL record holds it: no token offsets, the anchor only when the env
    gave one that differs from the observation, ``first_shown`` only when ``windowed``."""
    record = asdict(turn)
    del record["reply_start"], record["reply_end"], record["context_start"]
    if turn.anchor is None:
        del record["anchor"]
    if not windowed:
        del record["first_shown"]
    return record


@dataclass
class Batch:
    """Right-padded training tensors, each (B, T); padding has attention 0 and loss 0."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T) float, 1 on sampled tokens
    rewards: torch.Tensor  # (B, T) float, placed per reward_placement
    scores: torch.Tensor  # (B,) float, episode returns
    group_ids: torch.Tensor  # (B,) long
    turn_ids: torch.Tensor  # (B, T) long, the 0-based turn of each reply token, -1 elsewhere
    logprobs: torch.Tensor  # (B, T) float, what the sampler reported per reply token, 0 elsewhere


def collate(
    trajectories: list[Trajectory], pad_id: int, placement: RewardPlacement = "last_token"
) -> Batch:
    """Stack trajectories into a Batch. Right padding keeps every real token's position
    (a causal model never looks right), so no sampled token changes under batching."""
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    width = max(len(t.token_ids) for t in trajectories)

    def pad(rows: list[list], value) -> list[list]:
        return [row + [value] * (width - len(row)) for row in rows]

    def turn_row(t: Trajectory) -> list[int]:
        row = [-1] * len(t.token_ids)
        for number, turn in enumerate(t.turns):
            row[turn.reply_start : turn.reply_end] = [number] * turn.reply_tokens
        return row

    return Batch(
        input_ids=torch.tensor(pad([t.token_ids for t in trajectories], pad_id)),
        attention_mask=torch.tensor(pad([[1] * len(t.token_ids) for t in trajectories], 0)),
        loss_mask=torch.tensor(pad([t.loss_mask for t in trajectories], 0), dtype=torch.float32),
        rewards=torch.tensor(pad([t.token_rewards(placement) for t in trajectories], 0.0)),
        scores=torch.tensor([t.total_reward for t in trajectories], dtype=torch.float32),
        group_ids=torch.tensor([t.group for t in trajectories]),
        turn_ids=torch.tensor(pad([turn_row(t) for t in trajectories], -1)),
        logprobs=torch.tensor(pad([t.logprobs for t in trajectories], 0.0)),
    )
