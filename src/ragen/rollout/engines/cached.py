"""The ``hf`` engine (the default): transformers forwards with KV caches kept between calls.

- The N identical prompts of a group are prefilled once and their keys and values copied to
  the N rows; the opening every new prompt of a call shares (system line, worked examples,
  rules) is prefilled once for all of them.
- Each episode's KV cache is kept between calls, so a later turn prefills only the tokens
  appended since (the env segment).
- Finished rows leave the decode batch at once, except on a GPU, where the batch keeps its
  shape so that each step replays a captured CUDA graph (static_decode.py).
- On a CPU a decode batch whose rows share a long prefix holds its keys and values once, and
  ragen's decode attention (attention.py) reads them once per step for all rows.

It samples with the shared rule and stops with the shared stop rule, so it plays what the
``naive`` reference plays: the tests hold the two to the same tokens.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import torch

from ragen import phases
from ragen.models.kv_keyword import cache_keyword, cache_kwarg
from ragen.rollout.engines.attention import NAME as DECODE_ATTENTION
from ragen.rollout.engines.attention import PREFIX_KEYWORD
from ragen.rollout.engines.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    Engine,
    GenerationStats,
    Request,
    Sample,
    Stopper,
    left_pad,
    pad_id,
    weights_version,
)
from ragen.rollout.engines.kv_cache import Batch, drop_rows, empty_cache, padded_cache, row_kv
from ragen.rollout.engines.memory import decode_batch
from ragen.rollout.engines.static_decode import StaticDecoder
from ragen.rollout.sampling import choose

# Padded tokens per prefill forward: bounds the activation memory of one forward.
_PREFILL_TOKEN_BUDGET = 16384
# New prompts sharing fewer opening tokens than this are prefilled whole: too little to save.
_MIN_SHARED_OPENING = 16
# A decode batch whose rows share fewer leading tokens than this keeps them in each row:
# holding a shorter prefix once saves too little to pay (benchmarks/attention.py measures it).
_MIN_SHARED_PREFIX = 128


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


class CachedGenerator(Engine):
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
        self.pad = pad_id(model, stopper)
        self.stats = GenerationStats()
        self._entries: dict[Hashable, _Entry] = {}
        self._weights = weights_version(model)

    def release(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._entries.pop(key, None)

    @torch.inference_mode()
    def _generate(
        self,
        requests: Sequence[Request],
        generators: list[torch.Generator],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
    ) -> list[Sample]:
        self._drop_stale()
        jobs = self._plan(requests)
        distinct = list({id(j): j for j in jobs}.values())
        with phases.timed(phases.ROLLOUT_PREFILL):
            self._share_opening(distinct)
            self._prefill(distinct)
        longest = max((len(r.context_ids) for r in requests), default=0) + max_new_tokens
        size = decode_batch(self.model, self.max_batch, longest, len(requests), self.stats)
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
        ids, chunk_mask = left_pad(new, self.pad)  # (B, N) each
        capacity = width + ids.shape[1]
        if width:
            cache = padded_cache(sources, width, capacity)
        else:
            cache = empty_cache(self.model, len(jobs), capacity)
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
            job.kv = row_kv(cache, b, mask[b].to(device))
            job.logits = logits[b]
            job.source = None
        self.stats.prefilled_tokens += sum(len(n) for n in new)
        self.stats.reused_tokens += sum(reuse)

    def _start_batch(
        self, rows: list[int], jobs: list[_Job], contexts: list[list[int]], max_new_tokens: int
    ) -> Batch:
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
        cache = padded_cache(sources, width, width + max_new_tokens - 1)
        logits = torch.stack([row_logits for _, row_logits in prefilled])  # (B, V)
        for i in rows:
            jobs[i].rows -= 1
            if jobs[i].rows == 0:  # the last copy has it now: free the job's cache
                jobs[i].kv = None
        mask = torch.arange(width)[None, :] >= (width - lengths)[:, None]  # (B, K)
        return Batch(list(rows), cache, mask, prefix, lengths + shared, logits)

    def _shared_prefix(self, contexts: list[list[int]], sources: list[torch.Tensor]):
        """The keys/values (layers, 2, H_kv, P, D) of the P leading tokens that every row of
        a decode batch has, bit for bit; None when rows share fewer than
        ``_MIN_SHARED_PREFIX`` tokens or the model's attention cannot take them (not
        ragen's decode attention, or a sliding window: the prefix is read whole, so a
        window that would hide its oldest tokens must see them masked instead).

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
            or has_sliding_window(model.config)
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

    def _decode(self, batch: Batch, requests, generators, max_new_tokens, temperature, top_p):
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
                tokens = drop_rows(batch, finished, tokens)
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
        self, batch: Batch, requests, generators, max_new_tokens, temperature, top_p
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

    def _take(self, batch: Batch, rows, tokens, logprobs, last: bool, requests, samples):
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

    def _finish(self, batch: Batch, b: int, i: int, request: Request) -> Sample:
        reply = batch.replies[i]
        finish = FINISH_STOP if self.stopper.done(reply) else FINISH_LENGTH
        # The cache holds the context and every reply token but the last (never fed back).
        kv = row_kv(batch.cache, b, batch.mask[b].to(self.model.device), batch.prefix)
        self._entries[request.key] = _Entry([*request.context_ids, *reply[:-1]], kv)
        return Sample(list(reply), list(batch.logprobs[i]), finish)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(k for k in range(n) if a[k] != b[k])


def has_sliding_window(config) -> bool:
    """Whether any layer of a model with this transformers config attends through a sliding
    window (a ``sliding_window`` that is in use, or a ``sliding_attention`` layer type)."""
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return True
    window = getattr(config, "sliding_window", None)
    return window is not None and getattr(config, "use_sliding_window", True) is not False


def _shared_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every one of ``sequences`` (at least one) shares."""
    first = sequences[0]
    return min(_common_prefix(first, other) for other in sequences)
