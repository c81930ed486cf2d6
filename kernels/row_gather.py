"""`deterministic_row_gather(table, idx)`: rows = table[idx], whose backward repeats bitwise.

index_select's backward scatter-adds the row gradients into the table with atomics, so the table
gradient's fp32 summation order, and with it its bits, change run to run: that alone makes the RFC's
diffusers and liger rows fail parameter repeatability. Here the backward is a fixed-order reduction
with no atomics, using norm_modulate's counting sort (kernels/norm_modulate.py, `segment_plan`):
the rows of each table row m, in ascending row order, are cut into chunks; each chunk is summed in
row order into one fp32 partial row (`_gather_partials_kernel`); then, per column, m's partials are
added in chunk order in tiles of PARAM_TILE (`sum_partials`), and the sum is rounded once.
Rows whose index is out of range add nothing (the forward, `index_select`, rejects them first).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import norm_modulate as K


@triton.jit(do_not_specialize=["n_rows"])
def _gather_partials_kernel(DR, PERM, SEG_START, CHUNK_START, PD, n_rows, H: tl.constexpr, M, stride_dr, CHUNK,
                            BLOCK_H: tl.constexpr, K_P2: tl.constexpr):
    pid = tl.program_id(0)
    k, lo, hi = K._chunk_of(pid, SEG_START, CHUNK_START, M, CHUNK, K_P2)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for pos in range(lo, hi):
        r = tl.load(PERM + pos).to(tl.int64)
        acc += tl.load(DR + r * stride_dr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(PD + pid.to(tl.int64) * H + cols, acc, mask=cols < tl.where(k < M, H, 0))


@triton.jit
def _gather_reduce_kernel(PD, CHUNK_START, DT, H: tl.constexpr, M, stride_dt, BLOCK_C: tl.constexpr,
                          P_TILE: tl.constexpr, BY_HAND: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    for m in range(0, M):
        total = K.sum_partials(PD, tl.load(CHUNK_START + m), tl.load(CHUNK_START + m + 1), cols, col_ok, H, P_TILE)
        tl.store(DT + m * stride_dt + cols, K._rounded(total, DT.dtype.element_ty, BY_HAND), mask=col_ok)


def table_gradient(row_grads: torch.Tensor, idx: torch.Tensor, table_rows: int) -> torch.Tensor:
    """sum of row_grads[r] over the rows r with idx[r] = m, for every m, in a fixed order."""
    rows, hidden = row_grads.shape
    device = row_grads.device
    out = torch.zeros((table_rows, hidden), dtype=row_grads.dtype, device=device)
    if rows == 0:
        return out
    cfg = K.block_config(hidden)
    plan = K.segment_plan(idx, table_rows, K.backward_chunk(rows, cfg, device))
    partials = torch.empty((plan.programs, hidden), dtype=torch.float32, device=device)
    _gather_partials_kernel[(plan.programs,)](
        row_grads, plan.perm, plan.seg_start, plan.chunk_start, partials, rows, hidden, table_rows,
        row_grads.stride(0), plan.chunk, BLOCK_H=cfg.block_h, K_P2=triton.next_power_of_2(table_rows + 2),
        num_warps=cfg.bwd_warps)
    _gather_reduce_kernel[(triton.cdiv(hidden, K.PARAM_COLS),)](
        partials, plan.chunk_start, out, hidden, table_rows, out.stride(0), BLOCK_C=K.PARAM_COLS,
        P_TILE=K.PARAM_TILE, BY_HAND=K.interpreter_active(), num_warps=4)
    return out


class _DeterministicRowGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, idx):
        ctx.save_for_backward(idx)
        ctx.table_rows = table.shape[0]
        return table.index_select(0, idx)

    @staticmethod
    def backward(ctx, row_grads):
        (idx,) = ctx.saved_tensors
        row_grads = row_grads if row_grads.stride(-1) == 1 else row_grads.contiguous()
        return table_gradient(row_grads, idx, ctx.table_rows), None


def deterministic_row_gather(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """table[idx] for a [M, H] table (any row stride) and [R] int32/int64 indices in [0, M)."""
    if not isinstance(table, torch.Tensor) or not isinstance(idx, torch.Tensor):
        raise TypeError("table and idx must be torch.Tensors")
    if table.dim() != 2:
        raise ValueError(f"table must be [M, H], got shape {tuple(table.shape)}")
    if idx.dim() != 1 or idx.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"idx must be a 1-D int32 or int64 tensor, got {idx.dtype} of shape {tuple(idx.shape)}")
    if idx.device != table.device:
        raise ValueError(f"idx is on {idx.device} but table is on {table.device}")
    return _DeterministicRowGather.apply(table, idx)
