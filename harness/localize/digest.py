"""Per-row digests of a tensor's bits: what a localisation run keeps of every tensor an op or module sees,
instead of the tensor. A digest is a weighted sum of the elements' bit patterns (as int64, wrapping) with
fixed odd weights: one element that differs always changes it, and two rows that differ elsewhere collide
with a chance of about 2**-64. A tensor's rows are its first dimension's blocks: with a first dimension of
k * R for a run of R rows, row r is the contiguous block of k slices from r * k (a flattened [B * T, H]
inside a model fed [B, T, H])."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.execute import as_bits

# Uninitialised memory: these ops' outputs are not compared.
UNINITIALISED = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                           "aten::new_empty_strided", "aten::empty_permuted", "aten::resize_"})
_WEIGHT_SEED = 0x5EED
_weights: dict[torch.device, torch.Tensor] = {}


@dataclass(frozen=True)
class Seen:
    """One tensor as a run saw it: shape, dtype, the digest of the whole tensor and, when its first
    dimension is a multiple of the run's rows, one digest per row (block)."""

    shape: tuple[int, ...]
    dtype: str
    whole: int
    rows: Optional[tuple[int, ...]]


def digestible(t) -> bool:
    """A plain dense tensor with real storage and 1, 2, 4 or 8-byte elements (a subclass, a sparse or meta
    tensor is not digested: its op's tensors then count as unmapped)."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided and not t.is_meta
            and t.element_size() in (1, 2, 4, 8))


def _weights_for(device: torch.device, count: int) -> torch.Tensor:
    found = _weights.get(device)
    if found is None or found.numel() < count:
        size = max(count, 1 << 12, 0 if found is None else 2 * found.numel())
        gen = torch.Generator().manual_seed(_WEIGHT_SEED)
        drawn = torch.randint(-(1 << 62), 1 << 62, (size,), generator=gen, dtype=torch.int64) * 2 + 1
        found = _weights[device] = drawn.to(device)
    return found[:count]


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:
        return t.contiguous().view(torch.uint8).to(torch.int64)
    return as_bits(t).to(torch.int64)


def digest(t: torch.Tensor, rows: int) -> torch.Tensor:
    """On the tensor's device: [whole, row 0, ..., row R-1] (only `whole` when the first dimension is not a
    multiple of `rows`). The whole digest does not depend on `rows`, and every row block is weighted alike,
    so a row's digest does not depend on where in the batch it sits."""
    bits = _bits(t.detach())
    flat = bits.reshape(-1)
    whole = (flat * _weights_for(t.device, flat.numel())).sum().reshape(1)
    if t.dim() == 0 or rows <= 0 or t.shape[0] == 0 or t.shape[0] % rows:
        return whole
    blocks = bits.reshape(rows, -1)
    return torch.cat([whole, (blocks * _weights_for(t.device, blocks.shape[1])).sum(1)])


def seen(t: torch.Tensor, values: list[int], rows: int) -> Seen:
    """The record of `t` from its digest's values."""
    per_row = tuple(values[1:]) if len(values) == rows + 1 and t.dim() and t.shape[0] % rows == 0 else None
    return Seen(tuple(t.shape), str(t.dtype).removeprefix("torch."), values[0], per_row)


def row_block(t: torch.Tensor, rows: int, picked: list[int]) -> torch.Tensor:
    """The blocks of `picked` rows of `t` (first dimension a multiple of `rows`), as [len(picked), -1]."""
    return t.detach().reshape(rows, -1)[torch.as_tensor(picked, device=t.device)].clone()
