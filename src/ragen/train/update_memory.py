"""How many rows each micro-batch of an update holds: ``trainer.micro_batch_size``, or fewer
where that many rows' activations would not fit the host memory free when the update starts.

A micro-batch's forward keeps, for its backward, activations in proportion to the tokens it
runs, so rows that fit one machine can have the run killed by the kernel on a smaller one
rather than slowed (docs/performance.md: a step's memory). The update therefore estimates
each micro-batch's bytes from the models' shapes (`DecoderBytes`) and, where the configured
rows would pass ``FREE_SHARE`` of the memory free at the update's start, cuts the
micro-batch to the rows that fit (at least one). Rows are cut, never tokens: the
micro-batches still add up to the same mini-batch loss, so a cut changes only the float
rounding of the gradient, and seconds; the step counts its cuts in
``perf/update_memory_cuts`` (passes over a mini-batch: a critic trained first takes its own
before the policy's), as decode batches count theirs.

Bytes a micro-batch of ``rows`` rows adds, each row ``width`` tokens of which ``prefix`` are
the opening every row of the mini-batch shares (run once, `SharedOpening`), with ``sampled``
tokens scored by the LM head, for each decoder whose activations are held at once:

    rows × ((width − prefix) × token + prefix × opening) + sampled × head

``token`` is 4 bytes × layers × (10 × hidden + 4 × intermediate), what autograd keeps per
token through a Llama-style block in float32 (norm inputs and outputs, query/key/value, the
attention's inputs and output, the MLP's gate, up and product); ``opening`` the row's copy
of the opening's keys and values per layer (2 × hidden + 2 × key/value width, the grouped
heads repeated); ``head`` 8 floats per vocabulary entry (logits, their log-softmax and
softmax, the entropy's terms, their gradients). ``python -m benchmarks.update_memory``
compares the estimate with the peaks updates add (docs/performance.md); the free share
leaves the margin for where it falls short. Under bf16 autocast the activations are smaller;
the estimate stays the float32 one, on the safe side.

Beside the activations, the update holds the gradients of every trained parameter (float32)
and, at a run's first update, allocates AdamW's two moments and a private copy of weights
mapped from the model's file (`first_step_bytes`); these are taken from the budget before
it is shared out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ragen.host.memory import available_memory, trim_heap

FLOAT_BYTES = 4
# Floats autograd keeps per token and decoder layer, as multiples of (hidden, intermediate).
TOKEN_FLOATS = (10, 4)
# A row's copy of the shared opening's keys and values, per layer, as multiples of (hidden,
# key/value width).
OPENING_FLOATS = (2, 2)
# Floats per vocabulary entry kept for each token the LM head scores.
HEAD_FLOATS = 8
# The micro-batches are planned to take at most this share of the memory free at the start.
FREE_SHARE = 0.8


@dataclass(frozen=True)
class DecoderBytes:
    """Bytes one decoder's forward keeps for its backward, per unit of a micro-batch."""

    token: int
    """per token a row runs through it (after the shared opening)"""
    opening: int
    """per token of the shared opening, per row (its keys and values)"""
    head: int
    """per token the LM head scores (0: no LM head, a critic's body)"""

    @classmethod
    def of(cls, config, *, head: bool) -> DecoderBytes | None:
        """From a transformers config (hidden_size, intermediate_size, num_hidden_layers,
        vocab_size, num_attention_heads, num_key_value_heads); None where one is missing or
        not a positive int: the update then takes the configured rows."""
        hidden = _size(config, "hidden_size")
        intermediate = _size(config, "intermediate_size")
        layers = _size(config, "num_hidden_layers")
        vocab = _size(config, "vocab_size")
        heads = _size(config, "num_attention_heads")
        if None in (hidden, intermediate, layers, vocab, heads):
            return None
        assert hidden and intermediate and layers and vocab and heads  # for mypy
        kv_heads = _size(config, "num_key_value_heads") or heads
        kv_width = hidden // heads * kv_heads
        per_layer = TOKEN_FLOATS[0] * hidden + TOKEN_FLOATS[1] * intermediate
        opening = OPENING_FLOATS[0] * hidden + OPENING_FLOATS[1] * kv_width
        return cls(
            token=FLOAT_BYTES * layers * per_layer,
            opening=FLOAT_BYTES * layers * opening,
            head=FLOAT_BYTES * HEAD_FLOATS * vocab if head else 0,
        )

    def __add__(self, other: DecoderBytes) -> DecoderBytes:
        """Two decoders whose activations are held at once (a policy and its critic)."""
        return DecoderBytes(
            self.token + other.token, self.opening + other.opening, self.head + other.head
        )


def _size(config, name: str) -> int | None:
    value = getattr(config, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def micro_batch_bytes(cost: DecoderBytes, rows: int, width: int, prefix: int, sampled: int) -> int:
    """Bytes a micro-batch of ``rows`` rows padded to ``width`` tokens adds (module
    docstring), ``prefix`` of them the shared opening, ``sampled`` scored by the head."""
    own = max(width - prefix, 0)
    return rows * (own * cost.token + prefix * cost.opening) + sampled * cost.head


def split(
    widths: list[int], sampled: list[int], prefix: int, most: int, budget: int, cost: DecoderBytes
) -> list[int]:
    """Sizes of the consecutive micro-batches of rows given longest first (``by_length``):
    each takes the next rows, at most ``most``, while its bytes (`micro_batch_bytes`, padded
    to its first and longest row) stay within ``budget``; at least one row each.

    widths, sampled: per row, its tokens and the tokens the head scores."""
    sizes: list[int] = []
    start = 0
    while start < len(widths):
        rows, scored = 1, sampled[start]
        while start + rows < len(widths) and rows < most:
            more = scored + sampled[start + rows]
            if micro_batch_bytes(cost, rows + 1, widths[start], prefix, more) > budget:
                break
            rows, scored = rows + 1, more
        sizes.append(rows)
        start += rows
    return sizes


def trained_bytes(*models: torch.nn.Module | None) -> int:
    """Bytes of the gradients of every trainable parameter of ``models`` (float32)."""
    return FLOAT_BYTES * sum(
        p.numel() for m in models if m is not None for p in m.parameters() if p.requires_grad
    )


def first_step_bytes(optimizers: dict[str, torch.optim.Optimizer]) -> int:
    """Bytes an optimiser's first step adds to what the process holds (0 once it has stepped):
    AdamW's two moments, and the weights' own copy: loaded weights are pages mapped from the
    model's file, read in by the first forward and copied on the step's first write, so both
    the file's pages and the copy are held through that step; 4 floats a parameter."""
    return sum(
        4 * FLOAT_BYTES * p.numel()
        for opt in optimizers.values()
        if not opt.state
        for group in opt.param_groups
        for p in group["params"]
        if p.requires_grad
    )


def activation_budget(held: int) -> int:
    """Bytes the micro-batches' activations may take: ``FREE_SHARE`` of the memory free now
    (after freed heap is returned), less ``held``, what the update holds besides (gradients,
    new optimiser moments); never below 0."""
    trim_heap()
    return max(int(available_memory() * FREE_SHARE) - held, 0)


@dataclass
class MemoryPlan:
    """An update's micro-batch plan: the bytes their activations may take (``budget``), what
    each decoder keeps per unit (``policy``: its decoder and LM head; ``critic``: its own
    body, None when it has none or reads the policy's pass), the rows a micro-batch holds
    at most (``most``: trainer.micro_batch_size), and the passes over a mini-batch it cut so
    far (a critic trained first takes a pass of its own before the policy's)."""

    budget: int
    policy: DecoderBytes
    critic: DecoderBytes | None
    most: int
    cuts: int = 0

    @classmethod
    def of(
        cls, policy, critic, optimizers: dict[str, torch.optim.Optimizer], most: int
    ) -> MemoryPlan | None:
        """The plan of an update of ``policy`` (and ``critic``) at this moment's free memory;
        None where the policy's shapes cannot be read (the configured rows are taken)."""
        cost = DecoderBytes.of(getattr(policy, "config", None), head=True)
        if cost is None:
            return None
        own_body = critic is not None and not getattr(critic, "detached_body", False)
        critic_cost = (
            DecoderBytes.of(getattr(critic.body, "config", None), head=False) if own_body else None
        )
        held = trained_bytes(policy, critic) + first_step_bytes(optimizers)
        return cls(activation_budget(held), cost, critic_cost, most)

    def cost(self, *, policy: bool, critic: bool) -> DecoderBytes:
        """What a micro-batch keeps per unit when it runs the policy, the critic, or both."""
        total = self.policy if policy else DecoderBytes(0, 0, 0)
        return total + self.critic if critic and self.critic is not None else total

    def for_pass(self, *, policy: bool, critic: bool) -> PassPlan:
        """The plan of one backward pass that runs the policy, the critic, or both."""
        return PassPlan(self, self.cost(policy=policy, critic=critic))

    def sizes(
        self, attention_mask: torch.Tensor, loss_mask: torch.Tensor, prefix: int, cost: DecoderBytes
    ) -> list[int]:
        """Sizes of the consecutive micro-batches of rows (B, T) given longest first, with
        ``prefix`` tokens of shared opening (run once: its own activations are taken from
        the budget first), each unit costing ``cost``; counts a cut where they are not the
        configured ones."""
        widths = [int(w) for w in attention_mask.sum(dim=1).tolist()]
        sampled = [int(s) for s in loss_mask.sum(dim=1).tolist()]
        budget = self.budget - prefix * cost.token
        got = split(widths, sampled, prefix, self.most, budget, cost)
        whole, rest = divmod(len(widths), self.most)
        self.cuts += got != [self.most] * whole + ([rest] if rest else [])
        return got


@dataclass(frozen=True)
class PassPlan:
    """A `MemoryPlan` bound to the cost per unit of one pass (`MemoryPlan.for_pass`), so
    that what cuts a pass's micro-batches travels as one value."""

    plan: MemoryPlan
    cost: DecoderBytes

    def sizes(
        self, attention_mask: torch.Tensor, loss_mask: torch.Tensor, prefix: int
    ) -> list[int]:
        """`MemoryPlan.sizes` at this pass's cost."""
        return self.plan.sizes(attention_mask, loss_mask, prefix, self.cost)
