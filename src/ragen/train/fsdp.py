"""FSDP2 (``trainer.parallel=fsdp``): each model's weights, gradients and optimiser states are
split over the processes with ``torch.distributed.fsdp.fully_shard`` (one shard of every
parameter per rank), where ddp keeps a whole copy of all three on every process.

A forward of a sharded model is a collective: every rank gathers each layer's weights at the
same time. How the trainer's passes keep to that rule:

- the update runs in lockstep: every rank runs as many micro-batch passes as the rank with the
  most rows (update.py pads with passes of weight 0); FSDP2 gathers the weights layer by
  layer and sums the gradients into each rank's shard (reduce-scatter);
- passes that need no gradient and whose count differs between ranks (rollout generation,
  evaluation, scoring, the template metrics of rank 0) run inside ``full_weights``: every rank
  gathers the whole weights once, then computes alone;
- ragen's scorers call a model's decoder and head rather than its ``forward`` (forward.py),
  and FSDP2 hangs its gathers and gradient reductions on the root's forward, so
  ``root_forward`` runs a scorer as a forward of the root;
- checkpoints go through torch.distributed.checkpoint's state-dict helpers: whole tensors on
  rank 0's CPU, so a checkpoint has the layout of an unsharded run (Hugging Face safetensors,
  torch.optim's optimiser state) and either kind of run resumes from it.

So the weights of each model must fit one device (the rollout gathers them); the gradients and
AdamW's two moments, three times the weights in float32, are what sharding divides.

Every function here leaves an unsharded model alone, so the trainer calls them either way.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

# The root's method that runs a function as one of its forwards (see ``root_forward``).
_ROOT_CALL = "ragen_root_call"
# Whole tensors, on rank 0's CPU only (the other ranks get {}): what a checkpoint writes.
_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
# Whole tensors read on rank 0, sent to the others, each rank keeping its shard. Not strict:
# a checkpoint holds the trainable weights, not buffers or a tied head's second name, and
# checkpoint.py checks for missing weights itself.
_SCATTER = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)


def is_sharded(model: torch.nn.Module | None) -> bool:
    return isinstance(model, FSDPModule)


def _fsdp_modules(model: torch.nn.Module | None) -> list[FSDPModule]:
    return [] if model is None else [m for m in model.modules() if isinstance(m, FSDPModule)]


def _layer_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the model's decoder layers: Hugging Face models list them as the
    modules that must not be split over devices (``_no_split_modules``)."""
    return {name for m in model.modules() for name in getattr(m, "_no_split_modules", None) or ()}


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` in place over the process group: each decoder layer, then the root (the
    embeddings, final norm, head, and a critic's value head), so one layer's weights are
    gathered at a time. Returns ``model``.

    Gradients are summed over ranks, not averaged: each rank's loss is its share of the
    mini-batch loss (update.py), so the sum is the one-process gradient.
    """
    layers = _layer_classes(model)
    for layer in [m for m in model.modules() if type(m).__name__ in layers]:
        fully_shard(layer)
    fully_shard(model)
    for module in _fsdp_modules(model):
        module.set_gradient_divide_factor(1.0)
        # A divide factor asks for a pre-multiplied sum, which gloo lacks; a factor of 1 is a
        # plain sum, and this makes FSDP2 say so.
        module.set_force_sum_reduction_for_comms(True)
    setattr(model, _ROOT_CALL, types.MethodType(_call, model))
    register_fsdp_forward_method(model, _ROOT_CALL)
    return model


def _call(model, fn: Callable, *args, **kwargs):
    return fn(model, *args, **kwargs)


def root_forward(fn: Callable) -> Callable:
    """``fn(model, ...)`` run as a forward of ``model`` when it is sharded (unchanged when not).

    FSDP2 gathers the root's weights (embeddings, head), decides which module is the root,
    and schedules the gradient reductions of a backward, all in hooks on the root's forward;
    a function that calls the decoder and the head directly would skip them.
    """

    @functools.wraps(fn)
    def run(model, *args, **kwargs):
        if is_sharded(model):
            return getattr(model, _ROOT_CALL)(fn, *args, **kwargs)
        return fn(model, *args, **kwargs)

    return run


def _reshard_layers_after_forward(model: FSDPModule, reshard: bool) -> None:
    model.set_reshard_after_forward(reshard)
    # The root keeps its weights after a forward whatever the layers do (FSDP2's own default:
    # a training step's backward needs them first).
    model.set_reshard_after_forward(False, recurse=False)


@contextmanager
def full_weights(*models: torch.nn.Module | None) -> Iterator[None]:
    """Inside the block, every sharded model of ``models`` (None and unsharded ones are
    skipped) holds its whole weights on every rank, so a forward gathers nothing and ranks may
    run different numbers of forwards. Every rank enters and leaves it together (gathering is
    a collective). For passes without gradients: the weights are shared, not trained."""
    # `is not None` first: mypy narrows a `Module | None` to FSDPModule only without None
    roots = [m for m in models if m is not None and isinstance(m, FSDPModule)]
    for root in roots:
        _reshard_layers_after_forward(root, False)
        for module in _fsdp_modules(root):
            module.unshard()
    try:
        yield
    finally:
        for root in roots:
            for module in _fsdp_modules(root):
                module.reshard()
            _reshard_layers_after_forward(root, True)


# ------------------------------------------------------------------------- checkpoints


def _tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Names that share one parameter (a head tied to the embeddings), first name first."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def gather_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the whole state dict of sharded ``model``, on rank 0's CPU ({} elsewhere).

    Tied names are pointed at one tensor, as in an unsharded model's state dict, so
    ``save_pretrained`` drops the tied copy as it does for an unsharded model.
    """
    # torch types state-dict values broadly (an optimiser's holds numbers and lists too); a
    # model's holds the tensors of its parameters and buffers.
    state = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=_GATHER))
    for first, *others in _tied_names(model):
        for name in others:
            if first in state:
                state[name] = state[first]
    return state


def scatter_model_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Collective: load whole ``tensors`` given on rank 0 (the other ranks pass {}) into
    sharded ``model``; each rank keeps its shard."""
    # A dict of tensors is one of the state dicts it takes; its dict parameter is invariant.
    set_model_state_dict(model, cast(dict[str, Any], tensors), options=_SCATTER)


def _optimizer_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of ``optimizer``'s parameters in its own order (torch.optim numbers them so)."""
    name = {id(p): n for n, p in model.named_parameters()}
    return [name[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _renamed(state: dict, rename: Callable) -> dict:
    return {
        "state": {rename(k): v for k, v in state["state"].items()},
        "param_groups": [
            {**g, "params": [rename(p) for p in g["params"]]} for g in state["param_groups"]
        ],
    }


def gather_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Collective: ``optimizer``'s whole state on rank 0's CPU ({} elsewhere), numbered like
    ``optimizer.state_dict()`` of an unsharded run, not by parameter name."""
    state = get_optimizer_state_dict(model, optimizer, options=_GATHER)
    if not state:
        return {}
    number = {n: i for i, n in enumerate(_optimizer_names(model, optimizer))}
    return _renamed(state, number.__getitem__)


def scatter_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict
) -> None:
    """Collective: load a whole optimiser state in ``optimizer.state_dict()``'s layout, given
    on rank 0 (the other ranks pass {}); each rank keeps its shard."""
    if state:
        state = _renamed(state, _optimizer_names(model, optimizer).__getitem__)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(model, optimizer, state, options=options)
