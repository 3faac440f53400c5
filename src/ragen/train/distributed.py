"""Data parallelism on PyTorch's own runtime: ``torchrun`` starts one process (rank) per
device, here they split each step's work and agree on everything else.

How a step is shared (trainer.py, loop.py and update.py call the helpers below):

- rollout: rank r plays its contiguous share of the env groups (``shard``), numbered as in
  the whole rollout, so the union of the shares is the 1-process rollout; the trajectories
  are then gathered, so every rank holds the whole step and takes the same filter decision,
  computes the same advantages (batch statistics included) and the same rollout metrics;
- scoring: each rank scores its share of the rows; the rows are assembled on every rank;
- update: each rank back-propagates its share of every mini-batch, with the loss scaled by the
  whole mini-batch's normaliser, and the gradients are summed across ranks before clipping,
  so every rank takes the same optimiser step as one process would on the whole batch;
- rank 0 writes the run directory and checkpoints and runs the collapse monitor; decisions
  that change the course of training are broadcast from it.

Without torchrun (no ``WORLD_SIZE`` > 1 in the environment) there is one rank and every
helper is the identity. The backend follows the device: gloo on CPU, NCCL on CUDA (one GPU
per process, the one numbered ``LOCAL_RANK``).
"""

from __future__ import annotations

import gc
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

_BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
_device = torch.device("cpu")  # where this rank's collectives run; set by ``session``


class LaunchError(ValueError):
    """A launch that cannot work as asked (environment, process count); says what to do."""


# ---------------------------------------------------------------------------- the launch


def _env_count(name: str, default: int, least: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise LaunchError(
            f"environment variable {name}={text!r} is not an integer >= {least}: "
            "launch with torchrun, which sets it, or unset it"
        )
    return value


def launched_world_size() -> int:
    """The number of processes torchrun started (``WORLD_SIZE``); 1 without torchrun."""
    return _env_count("WORLD_SIZE", 1, least=1)


def check_split(groups: int) -> None:
    """Refuse a rollout whose ``groups`` cannot be shared evenly by the launched processes."""
    world = launched_world_size()
    if groups % world:
        up = -(-groups // world) * world
        raise LaunchError(
            f"rollout.groups={groups} cannot be split evenly over {world} processes: set "
            f"rollout.groups={up} (a multiple of {world}) or launch a process count that "
            f"divides {groups}"
        )


def local_device(device: torch.device) -> torch.device:
    """The device of this process: under torchrun, plain ``cuda`` is the GPU ``LOCAL_RANK``."""
    if device.type != "cuda" or device.index is not None or launched_world_size() == 1:
        return device
    local, count = _env_count("LOCAL_RANK", 0, least=0), torch.cuda.device_count()
    if local >= count:
        raise LaunchError(
            f"LOCAL_RANK={local}, but this machine has {count} GPUs: launch at most {count} "
            f"processes per machine (torchrun --nproc_per_node {count})"
        )
    return torch.device("cuda", local)


@contextmanager
def session(device: torch.device) -> Iterator[None]:
    """Join the process group for the run (gloo for a CPU device, NCCL for CUDA) and leave
    it at the end; with one process there is nothing to join. A group the caller joined
    already (a script under torchrun that calls ``ragen.cli.main`` inside its own session) is
    used as it is and left to the caller."""
    global _device
    if launched_world_size() == 1:
        yield
        return
    if dist.is_initialized():
        previous, _device = _device, device
        try:
            yield
        finally:
            _device = previous
        return
    missing = [n for n in ("RANK", "MASTER_ADDR", "MASTER_PORT") if n not in os.environ]
    if missing:
        raise LaunchError(
            f"WORLD_SIZE is set but not {', '.join(missing)}: launch with torchrun "
            "(torchrun --nproc_per_node K -m ragen train ...)"
        )
    if device.type not in _BACKENDS:
        raise LaunchError(
            f"trainer.device={device} cannot run data-parallel: use cpu (gloo) or cuda (NCCL)"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(_BACKENDS[device.type])
    _device = device
    try:
        yield
        # every rank has finished its collectives before any tears its connections down (a
        # rank of the torchrun tests was seen to abort in gloo's teardown); not on an error,
        # where the other ranks may never arrive
        dist.barrier()
    finally:
        # Models, optimisers and collective work caught in reference cycles still hold the
        # group; freed later, at interpreter exit, a gloo thread that drops a tensor needs the
        # GIL of a dying interpreter and the process aborts ("terminate called without an
        # active exception"). Free them now, while both are alive. The caller's own
        # references must be gone by now: hold the run's objects in a scope inside this one.
        gc.collect()
        dist.destroy_process_group()
        _device = torch.device("cpu")


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0: the process that writes the run directory and prints."""
    return rank() == 0


def say(line: str) -> None:
    """Print a line of the run's story, once (from rank 0), above any progress bar."""
    if is_main():
        tqdm.write(line)


def shard(n: int) -> range:
    """This rank's contiguous share of ``n`` items (shares differ in size by one at most);
    the shares of ranks 0, 1, … follow each other, so concatenated they are ``range(n)``."""
    r, w = rank(), world_size()
    return range(r * n // w, (r + 1) * n // w)


# --------------------------------------------------------------------------- agreement


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` (any picklable object) on every rank."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, device=_device)
    return box[0]


def on_main(action: Callable[[], object]) -> None:
    """Run ``action`` on rank 0 only; an exception it raises is raised on every rank, so a
    refusal (a run directory that exists) ends every process with the same message instead
    of leaving the others waiting for a peer that has gone."""
    error = None
    if is_main():
        try:
            action()
        except Exception as exc:  # every error is passed on, then raised on every rank
            error = exc
    error = broadcast(error)
    if error is not None:
        raise error


def all_true(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on every rank."""
    if world_size() == 1:
        return flag
    value = torch.tensor(float(flag), device=_device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def check_everywhere(problem: str | None) -> None:
    """Raise on every rank the first problem any rank found (None: nothing wrong here)."""
    found = [p for p in gather(problem) if p is not None]
    if found:
        raise LaunchError(found[0])


# ------------------------------------------------------------------------------ data


def gather(value: Any) -> list:
    """Every rank's ``value``, in rank order, on every rank."""
    if world_size() == 1:
        return [value]
    parts: list = [None] * world_size()
    dist.all_gather_object(parts, value)
    return parts


def gather_list(items: list) -> list:
    """Every rank's list, concatenated in rank order, on every rank."""
    return [item for part in gather(items) for item in part]


def sum_dicts(values: dict[str, float]) -> dict[str, float]:
    """Per-key sums over ranks (a key missing on a rank counts 0 there), on every rank."""
    total: dict[str, float] = defaultdict(float)
    for part in gather(values):
        for key, value in part.items():
            total[key] += value
    return dict(total)


def assemble_rows(part: torch.Tensor, rows: range, total: int) -> torch.Tensor:
    """The rows ``rows`` computed here, (len(rows), ...), into the whole (total, ...) tensor
    on every rank: each rank writes its rows into zeros and the sum fills them all (adding
    zeros is exact, so every row keeps the bits its rank computed)."""
    if world_size() == 1:
        return part
    whole = part.new_zeros((total, *part.shape[1:]))
    whole[rows.start : rows.stop] = part
    dist.all_reduce(whole)
    return whole


def sum_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Sum the ``.grad`` of ``params`` over ranks, in place.

    Why a sum, and by hand rather than DistributedDataParallel: each rank's loss is its share
    of the mini-batch loss (aggregated with the whole mini-batch's normaliser, see update.py),
    so the sum of the ranks' gradients is exactly the 1-process gradient, whatever each rank's
    token count. A rank may hold no row of a small mini-batch (no backward at all), and the
    policy also samples outside any wrapper: one explicit sum before clipping covers both.
    A parameter that has no gradient on any rank keeps none, as it would in one process (the
    optimiser skips it instead of decaying it).
    """
    if world_size() == 1:
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    has_grad = torch.tensor([float(p.grad is not None) for p in params], device=_device)
    dist.all_reduce(has_grad)
    for param, count in zip(params, has_grad.tolist(), strict=True):
        if param.grad is None and count > 0:
            param.grad = torch.zeros_like(param)
    summed = [p for p in params if p.grad is not None]
    pending = [dist.all_reduce(p.grad, async_op=True) for p in summed]
    for work in pending:
        work.wait()
