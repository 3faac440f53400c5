"""The ``naive`` engine, the reference the others are held to: every call re-prefills every
context with ``model.generate`` (left padding, attention mask); nothing is kept between calls.
It samples with the shared rule (:func:`ragen.rollout.sampling.choose`) and stops with the
shared :class:`~ragen.rollout.engines.base.Stopper`, so it differs from the other engines
only in how it computes logits."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ragen import phases
from ragen.rollout.engines.base import (
    Engine,
    GenerationStats,
    Request,
    Sample,
    Stopper,
    left_pad,
    pad_id,
)
from ragen.rollout.engines.memory import decode_batch
from ragen.rollout.sampling import choose


class NaiveGenerator(Engine):
    """The reference: ``model.generate`` over the full contexts on every call, nothing kept."""

    def __init__(self, model, stopper: Stopper, max_batch: int | None = None):
        self.model, self.stopper, self.max_batch = model, stopper, max_batch
        self.stats = GenerationStats()

    @torch.inference_mode()
    def _generate(
        self,
        requests: Sequence[Request],
        generators: list[torch.Generator],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
    ) -> list[Sample]:
        longest = max((len(r.context_ids) for r in requests), default=0) + max_new_tokens
        size = decode_batch(self.model, self.max_batch, longest, len(requests), self.stats)
        samples: list[Sample] = []
        for start in range(0, len(requests), size):
            chunk = slice(start, start + size)
            with phases.timed(phases.ROLLOUT_DECODE):
                samples += self._chunk(
                    requests[chunk], generators[chunk], max_new_tokens, temperature, top_p
                )
        return samples

    def release(self, keys: Iterable[Hashable]) -> None:
        """Nothing is cached, so nothing to forget."""

    def _chunk(self, requests, generators, max_new_tokens, temperature, top_p) -> list[Sample]:
        pad = pad_id(self.model, self.stopper)
        ids, mask = left_pad([r.context_ids for r in requests], pad)  # (B, T) each
        self.stats.prefilled_tokens += int(mask.sum())
        device = self.model.device
        # A fresh config, so no sampling or penalty default of the model's own config applies.
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=sorted(self.stopper.eos) or None,
            return_dict_in_generate=True,
            output_logits=True,
        )
        # Greedy is HF's own argmax; sampling forces the shared rule's pick through greedy.
        processors = LogitsProcessorList(
            [_ForcedChoice(generators, temperature, top_p)] if temperature > 0 else []
        )
        out = self.model.generate(
            ids.to(device),
            attention_mask=mask.to(device),
            generation_config=config,
            logits_processor=processors,
            stopping_criteria=StoppingCriteriaList([_StopCriterion(self.stopper, ids.shape[1])]),
        )
        replies = out.sequences[:, ids.shape[1] :].cpu()  # (B, S)
        step_logprobs = [  # S tensors (B,): log-prob of each step's token, raw logits rescaled
            torch.log_softmax(logits.float() / (temperature or 1.0), -1)
            .gather(-1, replies[:, t, None].to(logits.device))
            .squeeze(-1)
            .cpu()
            for t, logits in enumerate(out.logits)
        ]
        logprobs = torch.stack(step_logprobs, 1)  # (B, S)
        samples = []
        for b in range(len(requests)):
            n, finish = self.stopper.cut(replies[b].tolist(), max_new_tokens)
            samples.append(Sample(replies[b, :n].tolist(), logprobs[b, :n].tolist(), finish))
        return samples


class _ForcedChoice:
    """A logits processor that samples with :func:`choose` and leaves only that token."""

    def __init__(self, generators, temperature: float, top_p: float):
        self.generators, self.temperature, self.top_p = generators, temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tokens, _ = choose(scores, self.generators, self.temperature, self.top_p)
        forced = torch.full_like(scores, float("-inf"))  # (B, V)
        return forced.scatter(-1, tokens[:, None], 0.0)


class _StopCriterion:
    """Ends ``model.generate`` rows with the shared stop rule (eos or stop string)."""

    def __init__(self, stopper: Stopper, prompt_len: int):
        self.stopper, self.prompt_len = stopper, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        replies = input_ids[:, self.prompt_len :].tolist()
        done = [self.stopper.done(r) for r in replies]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # (B,)
