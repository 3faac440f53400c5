"""What every engine shares: the request and sample types, the stop rule, and ``generate``.

An engine takes the whole dialogue of every episode as token ids and returns the sampled
reply tokens with their log-probs. :meth:`Engine.generate` is written once for all of them:
it checks the call, counts it, gives each request its noise generator, hands the call to the
engine's own ``_generate`` and counts the tokens it sampled.

Sampling is reproducible and independent of batching: each request draws its noise from its
own ``torch.Generator`` seeded from ``(seed, stream)``, once per step (the rule is in
:mod:`ragen.rollout.sampling`), so neither ``max_batch`` nor which other rows finished early
changes a row's sample. The stream is the request's own number when it carries one (the
loop numbers its episodes, so an episode samples the same reply whichever process or call it
is played in), else its position in the call. The caller should pass a different ``seed``
on every call (the loop uses one per turn).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ragen.rollout.sampling import row_generators

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(frozen=True)
class Request:
    """One episode's dialogue so far, ending where the model must continue.

    ``key`` names the episode: the same key on a later call means "this dialogue continued".
    ``context_ids`` is the WHOLE dialogue as token ids (prompt, earlier replies, env text).
    ``stream`` numbers the request's sampling noise; None: its position in the call.
    ``env`` is the episode's env, for a generator that plays from the state instead of
    sampling a model (the expert of ``ragen sft``); model generators never read it.
    """

    key: Hashable
    context_ids: list[int]
    stream: int | None = None
    env: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Sample:
    """A sampled reply.

    ``token_ids`` includes the stop token when one was sampled. ``logprobs[t]`` is the
    log-prob of ``token_ids[t]`` under ``log_softmax(logits / temperature)`` (plain
    ``log_softmax(logits)`` for temperature 0), before any top-p truncation. ``finish`` is
    ``"stop"`` (an eos id or a stop string) or ``"length"`` (``max_new_tokens`` reached).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish: str


@dataclass
class GenerationStats:
    """Running totals of one generator, for benchmarks and tests."""

    calls: int = 0
    prefilled_tokens: int = 0  # context tokens run through the model before decoding
    reused_tokens: int = 0  # context tokens whose keys/values came from a cache instead
    generated_tokens: int = 0  # sampled reply tokens returned
    # context tokens of decode rows whose keys/values the batch held once, not per row
    shared_tokens: int = 0
    # decode batches and evaluation waves that free memory made smaller than planned
    # (rollout/engines/memory.py): samples that can differ from a run with more memory free
    memory_cuts: int = 0


class Generator(Protocol):
    """What the rollout loop needs from a text generator."""

    stats: GenerationStats

    def generate(
        self,
        requests: Sequence[Request],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[Sample]: ...

    def release(self, keys: Iterable[Hashable]) -> None: ...


class Engine(ABC):
    """A :class:`Generator` that samples a model; subclasses write only ``_generate``
    (the engine's own part of a call) and ``release``."""

    stats: GenerationStats

    def generate(
        self,
        requests: Sequence[Request],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[Sample]:
        check_call(requests, max_new_tokens, temperature, top_p)
        self.stats.calls += 1
        generators = request_generators(seed, requests)
        samples = self._generate(requests, generators, max_new_tokens, temperature, top_p)
        self.stats.generated_tokens += sum(len(s.token_ids) for s in samples)
        return samples

    @abstractmethod
    def _generate(
        self,
        requests: Sequence[Request],
        generators: list[torch.Generator],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
    ) -> list[Sample]:
        """One sample per request, in the requests' order; ``generators[i]`` is the noise
        of ``requests[i]``. The call has been checked (:func:`check_call`)."""

    @abstractmethod
    def release(self, keys: Iterable[Hashable]) -> None:
        """Forget what is kept for the episodes ``keys``: they will not be asked again."""


# ----------------------------------------------------------------------------- shared rules


def eos_ids(model, tokenizer) -> frozenset[int]:
    """The ids that end a reply: the tokenizer's eos and the model's generation-config eos."""
    ids = {tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)}
    flat: set[int] = set()
    for value in ids:
        if isinstance(value, int):
            flat.add(value)
        elif value is not None:
            flat.update(value)
    return frozenset(flat)


class Stopper:
    """Decides whether a reply has ended: an eos id, or a stop string in the decoded reply.

    Checked after every sampled token, so a stop string that appears is always completed by
    the newest token, which is kept (with any characters it carries past the string).
    """

    def __init__(self, tokenizer, eos: Iterable[int], stop_strings: Sequence[str]):
        self.tokenizer = tokenizer
        self.eos = frozenset(eos)
        self.stop_strings = tuple(s for s in stop_strings if s)
        # Every token decodes to at least one byte, so a stop string of n bytes lies within
        # the last n tokens; one more absorbs a token split inside a UTF-8 character.
        self.window = max((len(s.encode()) for s in self.stop_strings), default=0) + 1

    def done(self, reply: Sequence[int]) -> bool:
        if reply and reply[-1] in self.eos:
            return True
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(reply[-self.window :], skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)

    def cut(self, reply: Sequence[int], max_new_tokens: int) -> tuple[int, str]:
        """Length of ``reply`` up to its first stop, and the finish reason."""
        for n in range(1, len(reply) + 1):
            if self.done(reply[:n]):
                return n, FINISH_STOP
        if len(reply) < max_new_tokens:
            raise RuntimeError(f"a reply of {len(reply)} < {max_new_tokens} tokens never stopped")
        return len(reply), FINISH_LENGTH


def request_generators(seed: int, requests: Sequence[Request]) -> list[torch.Generator]:
    """The noise generator of each request of a call: its own stream, else its position."""
    return row_generators(
        seed, (i if r.stream is None else r.stream for i, r in enumerate(requests))
    )


def check_call(requests: Sequence[Request], max_new_tokens: int, temperature: float, top_p):
    """Refuse, saying why, a call that no engine can serve."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    keys = [r.key for r in requests]
    if len(set(keys)) != len(keys):
        raise ValueError("two requests share a key: each episode may appear once per call")
    streams = [r.stream for r in requests if r.stream is not None]
    if len(set(streams)) != len(streams):
        raise ValueError("two requests share a noise stream: number each episode's stream once")
    for r in requests:
        if not r.context_ids:
            raise ValueError(f"request {r.key!r} has no context tokens to continue")


def weights_version(model) -> int:
    # In-place updates (optimizer steps, load_state_dict) bump each tensor's version counter.
    return sum(p._version for p in model.parameters())


def pad_id(model, stopper: Stopper) -> int:
    """The id padding fills rows with: the model's, else the tokenizer's, else an eos id."""
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = stopper.tokenizer.pad_token_id
    if pad is None:
        pad = min(stopper.eos) if stopper.eos else 0
    return int(pad)


def left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows → ids (B, T) padded on the left with ``pad``, and their mask (B, T)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[b, width - len(row) :] = 1
    return ids, mask
