"""Text generation backends for the rollout loop: a reference and a fast KV-cached path.

Both backends take the whole dialogue of every episode as token ids and return the sampled
reply tokens with their log-probs. They share the sampling rule and the stop rule, so they
differ only in how they compute logits:

- ``naive`` (the reference): every call re-prefills every context with ``model.generate``
  (left padding, attention mask). Nothing is kept between calls.
- ``hf`` (the default): the N identical prompts of a group are prefilled once and their keys
  and values copied to the N rows; the opening every new prompt of a call shares (system
  line, worked examples, rules) is prefilled once for all of them; each episode's KV cache is
  kept between calls, so a later turn prefills only the tokens appended since (the env
  segment); finished rows leave the decode batch at once, except on a GPU, where the batch
  keeps its shape so that each step replays a captured CUDA graph (static_decode.py).

Sampling is reproducible and independent of batching: each request draws its noise from its
own ``torch.Generator`` seeded from ``(seed, stream)``, once per step (the rule is in
:mod:`ragen.rollout.sampling`), so neither ``max_batch`` nor which other rows finished early
changes a row's sample. The stream is the request's own number when it carries one (the
loop numbers its episodes, so an episode samples the same reply whichever process or call it
is played in), else its position in the call. The caller should pass a different ``seed``
on every call (the loop uses one per turn).
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from ragen import phases
from ragen.host.memory import available_memory, total_memory
from ragen.kv_keyword import cache_keyword, cache_kwarg
from ragen.rollout.attention import NAME as DECODE_ATTENTION
from ragen.rollout.attention import PREFIX_KEYWORD
from ragen.rollout.sampling import choose, row_generators
from ragen.rollout.static_decode import StaticDecoder

FINISH_STOP = "stop"
FINISH_LENGTH = "length"

# Largest batch the automatic choice picks: beyond 64 rows a 2-core CPU gains nothing per
# token, while on a GPU rows come almost free (an H200 replayed SmolLM2-135M's decode step
# in 4.7 ms at 32 rows and 8.2 ms at 128).
_MAX_AUTO_BATCH_CPU = 64
_MAX_AUTO_BATCH_GPU = 256
# Padded tokens per prefill forward: bounds the activation memory of one forward.
_PREFILL_TOKEN_BUDGET = 16384
# New prompts sharing fewer opening tokens than this are prefilled whole: too little to save.
_MIN_SHARED_OPENING = 16
# A decode batch whose rows share fewer leading tokens than this keeps them in each row:
# holding 64 once was no faster a layer, 128 level to 1.19x (benchmarks/attention.py).
_MIN_SHARED_PREFIX = 128
# Shares of the device's whole memory that the decode batch's KV cache (copied each step) and
# the caches kept between turns (all live episodes together) are planned to take. Planned
# from the whole memory, not from what happens to be free, so that one machine sizes them
# alike on every run: which rows decode together changes a row's samples at float rounding
# (two bf16 evaluations of one Sokoban checkpoint, sized from free memory in waves of 198 and
# 196 seeds, played 31 of 256 episodes differently).
_BATCH_SHARE = 0.2
_KEPT_SHARE = 0.3
# A plan never takes more than this share of the memory free when it is made: where too
# little is free (other processes, or a large model beside its trainer) the sizes shrink, and
# the run warns that its samples then depend on what else holds memory.
_FREE_SHARE = 0.6
MEMORY_SHORT = (
    "free memory is short: ragen plans its decode batches and kept caches from the machine's "
    "whole memory so that runs repeat exactly, but too little of it is free now, so they "
    "shrink to fit; this run's samples can then differ, at float rounding, from a run with "
    "more memory free"
)


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


def _pad_id(model, stopper: Stopper) -> int:
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = stopper.tokenizer.pad_token_id
    if pad is None:
        pad = min(stopper.eos) if stopper.eos else 0
    return int(pad)


def _left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows → ids (B, T) padded on the left with ``pad``, and their mask (B, T)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[b, width - len(row) :] = 1
    return ids, mask


def _kv_shape(model) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim) of a transformers decoder."""
    config = model.config.get_text_config()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, heads, head_dim


def _kv_bytes_per_token(model) -> int:
    layers, heads, head_dim = _kv_shape(model)
    return layers * 2 * heads * head_dim * next(model.parameters()).element_size()


def _free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        # The driver counts the blocks torch's allocator keeps cached (after an update, its
        # activations) as used; torch hands them out again before asking the driver.
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    return available_memory()


def _total_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return total_memory()


def memory_fit(device: torch.device, share: float, item_bytes: int, wanted: int) -> int:
    """How many items of ``item_bytes`` to hold at once, at most ``wanted`` and at least 1:
    ``share`` of the device's whole memory, cut (with a warning) to ``_FREE_SHARE`` of the
    memory free now where less is free."""
    planned = min(wanted, int(_total_memory(device) * share // item_bytes))
    allowed = int(_free_memory(device) * _FREE_SHARE // item_bytes)
    if allowed < planned:
        warnings.warn(MEMORY_SHORT, stacklevel=3)
        planned = allowed
    return max(1, planned)


def auto_max_batch(model, longest_tokens: int) -> int:
    """Rows whose KV caches (held about three times over while decoding) fit the decode
    batch's share of memory, at most ``_MAX_AUTO_BATCH_CPU`` (or ``_GPU``) rows."""
    per_row = 3 * _kv_bytes_per_token(model) * max(longest_tokens, 1)
    cap = _MAX_AUTO_BATCH_CPU if model.device.type == "cpu" else _MAX_AUTO_BATCH_GPU
    return memory_fit(model.device, _BATCH_SHARE, per_row, cap)


def kept_cache_episodes(model, context_tokens: int, wanted: int) -> int:
    """Episodes, at most ``wanted``, whose caches, kept between turns (`CachedGenerator`) at up
    to ``context_tokens`` each, fit their share of memory: how many to play at once when the
    number is free to choose, as in an evaluation: 256 FrozenLake episodes of ~1,500 tokens
    keep 18 GB of float32 caches, more than a 24 GB machine has beside a trainer."""
    per_episode = _kv_bytes_per_token(model) * max(context_tokens, 1)
    return memory_fit(model.device, _KEPT_SHARE, per_episode, wanted)


# ----------------------------------------------------------------------------- naive backend


class NaiveGenerator:
    """The reference: ``model.generate`` over the full contexts on every call, nothing kept."""

    def __init__(self, model, stopper: Stopper, max_batch: int | None = None):
        self.model, self.stopper, self.max_batch = model, stopper, max_batch
        self.stats = GenerationStats()

    @torch.inference_mode()
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
        longest = max((len(r.context_ids) for r in requests), default=0) + max_new_tokens
        size = self.max_batch or auto_max_batch(self.model, longest)
        samples: list[Sample] = []
        for start in range(0, len(requests), size):
            chunk = slice(start, start + size)
            with phases.timed(phases.ROLLOUT_DECODE):
                samples += self._chunk(
                    requests[chunk], generators[chunk], max_new_tokens, temperature, top_p
                )
        self.stats.generated_tokens += sum(len(s.token_ids) for s in samples)
        return samples

    def release(self, keys: Iterable[Hashable]) -> None:
        """Nothing is cached, so nothing to forget."""

    def _chunk(self, requests, generators, max_new_tokens, temperature, top_p) -> list[Sample]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        pad = _pad_id(self.model, self.stopper)
        ids, mask = _left_pad([r.context_ids for r in requests], pad)  # (B, T) each
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


# ----------------------------------------------------------------------------- cached backend


@dataclass
class _Entry:
    """An episode's cache: ``kv`` holds the keys and values of exactly the tokens ``ids``."""

    ids: list[int]
    kv: torch.Tensor  # (layers, 2, H_kv, len(ids), D)


@dataclass
class _Job:
    """One distinct context to prefill; identical contexts of a call share one job."""

    context: list[int]
    reuse: int = 0  # leading tokens whose keys/values come from ``source``
    source: torch.Tensor | None = None  # (layers, 2, H_kv, >= reuse, D)
    kv: torch.Tensor | None = None  # after prefill: (layers, 2, H_kv, len(context), D)
    logits: torch.Tensor | None = None  # after prefill: (V,) at the last context token
    rows: int = 0  # requests still to decode from this job

    def prefilled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(kv, logits), which ``_prefill_forward`` sets before any row decodes from the job."""
        assert self.kv is not None and self.logits is not None
        return self.kv, self.logits

    def reused(self) -> torch.Tensor | None:
        """The ``reuse`` leading keys/values taken from ``source``; None when nothing is."""
        if not self.reuse:
            return None
        assert self.source is not None  # a job is given a reuse and its source together
        return self.source[:, :, :, : self.reuse]


@dataclass
class _Batch:
    """The rows being decoded together; row ``b`` is request ``index[b]``."""

    index: list[int]
    cache: _BufferCache  # (B, H_kv, K, D) keys and values per layer, left-padded
    mask: torch.Tensor  # (B, K) bool: which cache columns hold a real token of the row
    # (layers, 2, H_kv, P, D): the P leading tokens every row shares, held once and not in
    # ``cache`` (whose columns then follow them); None: each row's cache holds all its tokens.
    prefix: torch.Tensor | None
    positions: torch.Tensor  # (B,) long: position of the next token fed to each row
    logits: torch.Tensor  # (B, V): the distribution of each row's next token
    replies: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[float]] = field(default_factory=dict)


class CachedGenerator:
    """The fast path: shared group prefill, KV caches kept per episode, and decode steps
    that drop finished rows (``static=False``, the default on a CPU) or replay one captured
    CUDA graph per batch (``static=True``, the default on a GPU; see static_decode.py)."""

    def __init__(
        self,
        model,
        stopper: Stopper,
        max_batch: int | None = None,
        *,
        static: bool | None = None,
        share_prefix: bool = True,
    ):
        self.model, self.stopper, self.max_batch = model, stopper, max_batch
        # None: static decode steps (CUDA graphs) on a GPU, the shrinking batch elsewhere.
        self.static = model.device.type == "cuda" if static is None else static
        # False: every decode row holds its whole cache (benchmarks/rollout.py compares both).
        self.share_prefix = share_prefix
        self.pad = _pad_id(model, stopper)
        self.stats = GenerationStats()
        self._entries: dict[Hashable, _Entry] = {}
        self._weights = weights_version(model)

    def release(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._entries.pop(key, None)

    @torch.inference_mode()
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
        self._drop_stale()
        jobs = self._plan(requests)
        distinct = list({id(j): j for j in jobs}.values())
        with phases.timed(phases.ROLLOUT_PREFILL):
            self._share_opening(distinct)
            self._prefill(distinct)
        generators = request_generators(seed, requests)
        longest = max((len(r.context_ids) for r in requests), default=0) + max_new_tokens
        size = self.max_batch or auto_max_batch(self.model, longest)
        # Rows of similar length decode together, so left padding wastes little.
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].context_ids))
        samples: dict[int, Sample] = {}
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            with phases.timed(phases.ROLLOUT_DECODE):
                contexts = [requests[i].context_ids for i in rows]
                batch = self._start_batch(rows, jobs, contexts, max_new_tokens)
                decode = self._decode_static if self.static else self._decode
                samples |= decode(batch, requests, generators, max_new_tokens, temperature, top_p)
        self.stats.generated_tokens += sum(len(s.token_ids) for s in samples.values())
        return [samples[i] for i in range(len(requests))]

    def _drop_stale(self) -> None:
        # An optimiser step changes the weights in place, which makes every kept cache wrong.
        version = weights_version(self.model)
        if version != self._weights:
            self._entries.clear()
            self._weights = version

    def _plan(self, requests: Sequence[Request]) -> list[_Job]:
        """One job per distinct context, reusing the longest cached prefix any of its keys has."""
        by_context: dict[tuple[int, ...], _Job] = {}
        jobs = []
        for r in requests:
            context = tuple(r.context_ids)
            job = by_context.setdefault(context, _Job(list(context)))
            job.rows += 1
            entry = self._entries.pop(r.key, None)  # consumed: the key gets a new entry
            if entry is not None:
                # At least one token must be fed, to get the logits of the next one.
                reuse = min(_common_prefix(entry.ids, job.context), len(job.context) - 1)
                if reuse > job.reuse:
                    job.reuse, job.source = reuse, entry.kv
            jobs.append(job)
        return jobs

    def _share_opening(self, jobs: list[_Job]) -> None:
        """Prefill once the opening that every job without a cached prefix shares (the
        system line, worked examples and rules of a first turn); they continue from it."""
        fresh = [j for j in jobs if j.reuse == 0]
        if len(fresh) < 2:
            return
        contexts = [j.context for j in fresh]
        # At least one token of each job stays its own, to get the logits of the next one.
        common = min(_shared_length(contexts), min(len(c) for c in contexts) - 1)
        if common < _MIN_SHARED_OPENING:
            return
        opening = _Job(contexts[0][:common])
        self._prefill_forward([opening])
        for job in fresh:
            job.reuse, job.source = common, opening.kv

    def _prefill(self, jobs: list[_Job]) -> None:
        """Run every job's new tokens, in forwards of at most ``_PREFILL_TOKEN_BUDGET``."""
        jobs = sorted(jobs, key=lambda j: len(j.context) - j.reuse)
        group: list[_Job] = []
        for job in jobs:
            width = len(job.context) - job.reuse + max(j.reuse for j in [*group, job])
            if group and (len(group) + 1) * width > _PREFILL_TOKEN_BUDGET:
                self._prefill_forward(group)
                group = []
            group.append(job)
        if group:
            self._prefill_forward(group)

    def _prefill_forward(self, jobs: list[_Job]) -> None:
        """One forward over the jobs' new tokens on top of their reused caches.

        Layout of row b: cache columns [pad | reused c_b] then chunk columns [pad | new n_b];
        the chunk is left-padded so the last column is every row's last token and only its
        logits are computed. The pad columns in between are holes in the attention mask.
        """
        reuse = [j.reuse for j in jobs]
        new = [j.context[j.reuse :] for j in jobs]
        width = max(reuse)
        sources = [j.reused() for j in jobs]
        ids, chunk_mask = _left_pad(new, self.pad)  # (B, N) each
        capacity = width + ids.shape[1]
        if width:
            cache = _padded_cache(sources, width, capacity)
        else:
            cache = _empty_cache(self.model, len(jobs), capacity)
        old_mask = torch.arange(width)[None, :] >= width - torch.tensor(reuse)[:, None]  # (B, C)
        mask = torch.cat([old_mask, chunk_mask.bool()], 1)  # (B, C + N)
        # Position of chunk column i in row b: the row's token count before it; pads get 0.
        positions = (torch.tensor(reuse)[:, None] + chunk_mask.cumsum(1) - 1).clamp(min=0)
        device = self.model.device
        out = self.model(
            input_ids=ids.to(device),
            attention_mask=mask.long().to(device),
            position_ids=positions.to(device),
            **cache_kwarg(self.model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1]  # (B, V)
        for b, job in enumerate(jobs):
            job.kv = _row_kv(cache, b, mask[b].to(device))
            job.logits = logits[b]
            job.source = None
        self.stats.prefilled_tokens += sum(len(n) for n in new)
        self.stats.reused_tokens += sum(reuse)

    def _start_batch(
        self, rows: list[int], jobs: list[_Job], contexts: list[list[int]], max_new_tokens: int
    ) -> _Batch:
        """Stack the prefilled caches of ``rows`` (copies of a group share one) into a batch;
        ``contexts`` are the rows' token ids. The leading tokens all rows share are held once
        where the decode attention can read them so (see ``_shared_prefix``)."""
        prefilled = [jobs[i].prefilled() for i in rows]
        sources = [kv for kv, _ in prefilled]
        prefix = self._shared_prefix(contexts, sources)
        shared = 0 if prefix is None else prefix.shape[3]
        if shared:
            sources = [s[:, :, :, shared:] for s in sources]
        lengths = torch.tensor([s.shape[3] for s in sources])  # (B,) columns in the cache
        width = int(lengths.max())
        # Room for every reply token but the last, which is sampled and never fed back.
        cache = _padded_cache(sources, width, width + max_new_tokens - 1)
        logits = torch.stack([row_logits for _, row_logits in prefilled])  # (B, V)
        for i in rows:
            jobs[i].rows -= 1
            if jobs[i].rows == 0:  # the last copy has it now: free the job's cache
                jobs[i].kv = None
        mask = torch.arange(width)[None, :] >= (width - lengths)[:, None]  # (B, K)
        return _Batch(list(rows), cache, mask, prefix, lengths + shared, logits)

    def _shared_prefix(self, contexts: list[list[int]], sources: list[torch.Tensor]):
        """The keys/values (layers, 2, H_kv, P, D) of the P leading tokens that every row of
        a decode batch has, bit for bit; None when rows share fewer than
        ``_MIN_SHARED_PREFIX`` tokens or the model's attention cannot take them.

        Each decode step then reads the prefix once for the whole batch instead of once per
        row. Rows hold equal bits for their shared tokens because every cache of them
        descends from one prefill of the opening (``_share_opening``); the check keeps any
        row that does not in its own cache.
        """
        model = self.model
        if (
            self.static
            or not self.share_prefix
            or len(sources) < 2
            or model.device.type != "cpu"
            or getattr(model.config, "_attn_implementation", None) != DECODE_ATTENTION
        ):
            return None
        common = _shared_length(contexts)
        if common < _MIN_SHARED_PREFIX:
            return None
        prefix = sources[0][:, :, :, :common]
        if not all(torch.equal(s[:, :, :, :common], prefix) for s in sources[1:]):
            return None
        self.stats.shared_tokens += common * len(sources)
        return prefix.contiguous()

    def _decode(self, batch: _Batch, requests, generators, max_new_tokens, temperature, top_p):
        """Sample until every row stops; a row's cache is kept as the episode's entry."""
        samples: dict[int, Sample] = {}
        device = self.model.device
        keyword = cache_keyword(self.model)  # once per call, not per decode step
        for step in range(max_new_tokens):
            rows_gens = [generators[i] for i in batch.index]
            tokens, logprobs = choose(batch.logits, rows_gens, temperature, top_p)  # (B,) each
            rows = range(len(batch.index))
            last = step + 1 == max_new_tokens
            finished = self._take(batch, rows, tokens, logprobs, last, requests, samples)
            if len(finished) == len(batch.index):
                break
            if finished:
                tokens = _drop_rows(batch, finished, tokens)
            batch.mask = torch.cat(
                [batch.mask, torch.ones(len(batch.index), 1, dtype=torch.bool)], 1
            )
            shared = {} if batch.prefix is None else {PREFIX_KEYWORD: batch.prefix}
            out = self.model(
                input_ids=tokens[:, None].to(device),
                attention_mask=batch.mask.long().to(device),
                position_ids=batch.positions[:, None].to(device),
                **{keyword: batch.cache},
                use_cache=True,
                **shared,
            )
            batch.logits = out.logits[:, -1]  # (B, V)
            batch.positions += 1
        return samples

    def _decode_static(
        self, batch: _Batch, requests, generators, max_new_tokens, temperature, top_p
    ):
        """:meth:`_decode` through a :class:`StaticDecoder` (a CUDA graph on a GPU): the
        batch keeps its rows to the end, and a row that stops is no longer read."""
        device = self.model.device
        try:
            decoder = StaticDecoder(
                self.model,
                [layer.buffer for layer in batch.cache.layers],
                batch.mask,
                batch.positions,
                batch.mask.shape[1],
                capture=device.type == "cuda",
            )
        except RuntimeError as err:  # a model whose forward cannot be captured
            warnings.warn(
                f"decoding without CUDA graphs: capturing a decode step failed ({err})",
                stacklevel=2,
            )
            self.static = False
            return self._decode(batch, requests, generators, max_new_tokens, temperature, top_p)
        samples: dict[int, Sample] = {}
        live = list(range(len(batch.index)))  # batch rows still sampling
        logits = batch.logits  # (B, V)
        fed = torch.zeros(len(batch.index), dtype=torch.long, device=device)  # (B,)
        for step in range(max_new_tokens):
            rows = torch.tensor(live, device=logits.device)
            rows_gens = [generators[batch.index[b]] for b in live]
            tokens, logprobs = choose(logits[rows], rows_gens, temperature, top_p)  # (B',)
            last = step + 1 == max_new_tokens
            finished = self._take(batch, live, tokens, logprobs, last, requests, samples)
            if len(finished) == len(live):
                break
            fed[rows.to(device)] = tokens.to(device)
            gone = set(finished)
            live = [b for k, b in enumerate(live) if k not in gone]
            batch.mask = torch.cat(
                [batch.mask, torch.ones(len(batch.index), 1, dtype=torch.bool)], 1
            )
            logits = decoder.step(fed)
        return samples

    def _take(self, batch: _Batch, rows, tokens, logprobs, last: bool, requests, samples):
        """Append to each of the batch ``rows`` its token of ``tokens`` (one per row) and
        log-prob; rows that stop (or all, when ``last``) are finished into ``samples``.
        Returns the positions in ``rows`` of the rows that finished."""
        finished = []
        for k, (b, token, logprob) in enumerate(
            zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)
        ):
            i = batch.index[b]
            reply = batch.replies.setdefault(i, [])
            reply.append(token)
            batch.logprobs.setdefault(i, []).append(logprob)
            if self.stopper.done(reply) or last:
                finished.append(k)
                samples[i] = self._finish(batch, b, i, requests[i])
        return finished

    def _finish(self, batch: _Batch, b: int, i: int, request: Request) -> Sample:
        reply = batch.replies[i]
        finish = FINISH_STOP if self.stopper.done(reply) else FINISH_LENGTH
        # The cache holds the context and every reply token but the last (never fed back).
        kv = _row_kv(batch.cache, b, batch.mask[b].to(self.model.device), batch.prefix)
        self._entries[request.key] = _Entry([*request.context_ids, *reply[:-1]], kv)
        return Sample(list(reply), list(batch.logprobs[i]), finish)


def _drop_rows(batch: _Batch, finished: list[int], tokens: torch.Tensor) -> torch.Tensor:
    """Remove the ``finished`` rows (ascending) from the batch; returns the live rows' tokens.

    The last live rows move into the finished rows' places and the batch is cut short, so
    only the moved rows' caches are copied: compacting by an index copied every row's cache
    at every finish, a twentieth of the rollout's time.
    """
    size = len(batch.index)
    gone = set(finished)
    live = size - len(gone)
    holes = [b for b in finished if b < live]
    movers = [b for b in range(live, size) if b not in gone]  # as many as holes
    order = list(range(live))  # new row -> old row
    for hole, mover in zip(holes, movers, strict=True):
        order[hole] = mover
    batch.cache.move_rows(holes, movers, live)
    keep = torch.tensor(order)
    batch.mask, batch.positions = batch.mask[keep], batch.positions[keep]
    batch.index = [batch.index[b] for b in order]
    return tokens[keep.to(tokens.device)]


def weights_version(model) -> int:
    # In-place updates (optimizer steps, load_state_dict) bump each tensor's version counter.
    return sum(p._version for p in model.parameters())


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(k for k in range(n) if a[k] != b[k])


def _shared_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every one of ``sequences`` (at least one) shares."""
    first = sequences[0]
    return min(_common_prefix(first, other) for other in sequences)


def _padded_cache(sources: Sequence[torch.Tensor | None], width: int, capacity: int):
    """A cache holding each row's keys/values right-aligned in its first ``width`` columns.

    sources: per row (layers, 2, H_kv, L_b, D) with L_b <= width, or None for an empty row.
    ``capacity`` columns are allocated, so the tokens fed later are written in place.
    """
    first = next(s for s in sources if s is not None)
    n_layers, _, heads, _, dim = first.shape
    layers = []
    for n in range(n_layers):
        kv = first.new_empty((2, len(sources), heads, capacity, dim))  # (2, B, H_kv, cap, D)
        for b, source in enumerate(sources):
            filled = 0 if source is None else source.shape[3]
            # Masked columns still enter the attention product (weight 0 × value), so they
            # must hold zeros, never leftover NaN bits. Columns past ``width`` are written
            # before they are read.
            kv[:, b, :, : width - filled] = 0
            if source is not None:
                kv[:, b, :, width - filled : width] = source[n]
        layers.append(_BufferLayer(kv, width))
    return _BufferCache(layers)


def _empty_cache(model, batch: int, capacity: int):
    """A cache of ``capacity`` empty columns for ``batch`` rows of ``model``."""
    layers, heads, head_dim = _kv_shape(model)
    param = next(model.parameters())
    shape = (2, batch, heads, capacity, head_dim)
    # Every column is written (by the prefill chunk) before it is read.
    return _BufferCache([_BufferLayer(param.new_empty(shape), 0) for _ in range(layers)])


class _BufferLayer(DynamicLayer):
    """A DynamicLayer whose keys/values live in a preallocated buffer.

    DynamicLayer concatenates on every update, copying the whole cache each decode step;
    profiled on this CPU that copy took three quarters of a step. Here a step writes its
    column in place and ``keys``/``values`` are views of the filled part.
    """

    def __init__(self, kv: torch.Tensor, length: int):  # kv: (2, B, H_kv, capacity, D)
        super().__init__()
        self.dtype, self.device, self.is_initialized = kv.dtype, kv.device, True
        self.buffer = kv
        self._fill(length)

    def _fill(self, length: int) -> None:
        self.length = length
        self.keys = self.buffer[0, :, :, :length]  # (B, H_kv, length, D)
        self.values = self.buffer[1, :, :, :length]

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[-2]
        if self.length + n > self.buffer.shape[3]:
            raise RuntimeError("KV buffer too small: the generator sized it wrongly")
        self.buffer[0, :, :, self.length : self.length + n] = key_states
        self.buffer[1, :, :, self.length : self.length + n] = value_states
        self._fill(self.length + n)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def move_rows(self, holes: list[int], movers: list[int], rows: int) -> None:
        """Copy rows ``movers`` into rows ``holes``, then keep the first ``rows`` rows."""
        if holes:
            dst, src = torch.tensor(holes), torch.tensor(movers)
            filled = slice(0, self.length)
            self.buffer[:, dst, :, filled] = self.buffer[:, src, :, filled]
        self.buffer = self.buffer[:, :rows]
        self._fill(self.length)


class _BufferCache(DynamicCache):
    """A DynamicCache made of :class:`_BufferLayer` s."""

    # transformers types `layers` as a list of every layer kind; __init__ puts only
    # _BufferLayer s in it, whose buffers move_rows and _row_kv use.
    layers: list[_BufferLayer]  # type: ignore[assignment]

    def __init__(self, layers: list[_BufferLayer]):
        Cache.__init__(self, layers=list(layers))

    def move_rows(self, holes: list[int], movers: list[int], rows: int) -> None:
        for layer in self.layers:
            layer.move_rows(holes, movers, rows)


def _spans(columns: torch.Tensor) -> list[tuple[int, int]]:
    """The runs of True in a (K,) bool mask, as [start, end) pairs."""
    edge = torch.zeros(1, dtype=torch.int8)
    flips = torch.diff(columns.to("cpu", torch.int8), prepend=edge, append=edge)
    bounds = flips.nonzero().flatten().tolist()  # start, end, start, end, ...
    return list(zip(bounds[::2], bounds[1::2], strict=True))


def _row_kv(
    cache: _BufferCache, b: int, columns: torch.Tensor, prefix: torch.Tensor | None = None
) -> torch.Tensor:
    """Row ``b``'s keys/values at the real-token ``columns`` (K,) bool → (layers, 2, H, L, D),
    after ``prefix`` (layers, 2, H, P, D) when the batch holds one.

    The real tokens lie in one or two runs of columns (cache, then the fed chunk), so they
    are copied run by run straight into the result: a boolean index would copy them twice.
    """
    spans = _spans(columns)
    first = cache.layers[0].buffer  # (2, B, H_kv, capacity, D)
    _, _, heads, _, dim = first.shape
    shared = 0 if prefix is None else prefix.shape[3]
    total = shared + sum(end - start for start, end in spans)
    out = first.new_empty((len(cache.layers), 2, heads, total, dim))
    if prefix is not None:
        out[:, :, :, :shared] = prefix
    for n, layer in enumerate(cache.layers):
        at = shared
        for start, end in spans:
            out[n, :, :, at : at + end - start] = layer.buffer[:, b, :, start:end]
            at += end - start
    return out
