"""The packed layout the token-level estimators compute on, and its discounted scan.

A row's sampled tokens are moved to the front (:func:`pack`), scanned there with no Python
loop over positions (:func:`discounted_suffix_sum`, a blocked matrix form), and written back
(:func:`unpack`). Shapes: ``B`` rows, ``T`` positions, ``K`` the most sampled tokens in a row.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def work_dtype(device: torch.device) -> torch.dtype:
    """float64 for the scans (exact enough to ignore rounding), where the device has it."""
    return torch.float32 if device.type == "mps" else torch.float64


def out_dtype(*tensors: Tensor) -> torch.dtype:
    """At least float32, else the widest floating dtype among the inputs."""
    dtype = torch.float32
    for t in tensors:
        if t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


# ------------------------------------------------------------------------------------ scans


def discounted_suffix_sum(x: Tensor, discount: float, block: int = 128) -> Tensor:
    """``y[..., k] = sum_{j >= k} discount**(j - k) * x[..., j]`` along the last dim.

    Args:
        x: (..., K) floating tensor.
        discount: factor in [0, 1].
        block: length of the blocks of the matrix form (memory O(block**2 + (K/block)**2)).

    Returns:
        (..., K) tensor, same dtype as ``x``.

    Vectorised, no loop over K: inside each block of ``L`` entries the suffix sums are one
    matmul with the (L, L) upper-triangular matrix ``discount**(j - i)``; the sum that
    continues past a block's end is the suffix sum at the next block's start, which a second
    matmul over block heads supplies.
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must lie in [0, 1], got {discount}")
    size = x.shape[-1]
    if size == 0:
        return x.clone()
    lead = x.shape[:-1]
    length = min(block, size)
    blocks = math.ceil(size / length)
    xb = torch.nn.functional.pad(x.reshape(-1, size), (0, blocks * length - size))
    xb = xb.view(-1, blocks, length)  # (R, nb, L)

    def powers(n: int, base: float) -> Tensor:
        """(n, n) matrix m[j, i] = base**(j - i) for j >= i, else 0."""
        idx = torch.arange(n, device=x.device)
        gap = idx[:, None] - idx[None, :]
        full = torch.pow(torch.tensor(base, dtype=x.dtype, device=x.device), gap.clamp(min=0))
        return torch.where(gap >= 0, full, torch.zeros((), dtype=x.dtype, device=x.device))

    inner = xb @ powers(length, discount)  # (R, nb, L): suffix sums within each block
    heads = inner[..., 0] @ powers(blocks, discount**length)  # (R, nb): full sum from each start
    carry = torch.nn.functional.pad(heads[:, 1:], (0, 1))  # (R, nb): sum from the next block
    offset = torch.arange(length, device=x.device)
    decay = torch.pow(torch.tensor(discount, dtype=x.dtype, device=x.device), length - offset)
    out = inner + carry[..., None] * decay  # (R, nb, L)
    return out.reshape(-1, blocks * length)[:, :size].reshape(*lead, size).contiguous()


def pack(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Sampled positions of each row moved to the front, in order.

    Args:
        mask: (B, T), nonzero on sampled tokens.

    Returns:
        idx (B, K) long: position of the k-th sampled token (K = most sampled tokens in a row;
        slots past a row's count point at its unsampled positions);
        valid (B, K) bool: slot k holds a sampled token.
    """
    sampled = mask != 0
    counts = sampled.sum(dim=1)
    width = int(counts.max()) if sampled.numel() else 0
    order = torch.argsort((~sampled).to(torch.int8), dim=1, stable=True)  # sampled first
    idx = order[:, :width]
    valid = torch.arange(width, device=mask.device)[None, :] < counts[:, None]
    return idx, valid


def gather(x: Tensor, idx: Tensor, valid: Tensor, dtype: torch.dtype) -> Tensor:
    """x (B, T) read at idx (B, K); 0 on invalid slots (even where x is not finite)."""
    picked = x.gather(1, idx).to(dtype)
    return torch.where(valid, picked, torch.zeros((), dtype=dtype, device=x.device))


def unpack(packed: Tensor, idx: Tensor, valid: Tensor, like: Tensor, dtype: torch.dtype) -> Tensor:
    """Inverse of the packing: (B, K) slots written back to (B, T), 0 elsewhere."""
    out = torch.zeros(like.shape, dtype=dtype, device=like.device)
    zero = torch.zeros((), dtype=packed.dtype, device=packed.device)
    return out.scatter(1, idx, torch.where(valid, packed, zero).to(dtype))


def shift_left(x: Tensor) -> Tensor:
    """(..., K) -> (..., K): x[..., k + 1], with 0 after the end."""
    return torch.nn.functional.pad(x[..., 1:], (0, 1))


def check_shapes(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"expected tensors of one (B, T) shape, got {shapes}")
