"""`deterministic_row_gather(table, idx)`: rows = table[idx], whose backward repeats bitwise.

index_select's backward scatter-adds the row gradients into the table with atomics, so the table
gradient's fp32 summation order, and with it its bits, change run to run: that alone makes the RFC's
diffusers and liger rows fail parameter repeatability. Here the backward is norm_modulate's fixed-order
reduction (kernels/norm_modulate_kernel.py): the rows are split into fixed chunks, one per program; a program
sorts its chunk by table row (`local_order`) and, for each table row m, sums its rows of m in
ascending row order into one fp32 partial row; then, per column, m's partials are added in program
order in tiles of PARAM_TILE (`sum_partials`), and the sum is rounded once. No atomics.
Rows whose index is out of range add nothing (the forward, `index_select`, rejects them first).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3bench.kernels import norm_modulate_kernel as K
from h3bench.kernels.common import BY_HAND, cdiv, launch, next_power_of_2, param_tile, pick, program_rows, rounded, sum_partials


@triton.jit(do_not_specialize=["n_rows"])
def _gather_partials_kernel(DR, IDX, ORDER, PD, n_rows, H: tl.constexpr, M, stride_dr, CHUNK,
                            BLOCK_H: tl.constexpr, CMAX: tl.constexpr, K_P2: tl.constexpr):
    pid, lo, n, starts, counts = program_rows(IDX, ORDER, n_rows, M, CHUNK, CMAX, K_P2)
    ks = tl.arange(0, K_P2)
    cols = tl.arange(0, BLOCK_H)
    for m in range(0, M):
        s0 = pick(starts, ks, m)
        s1 = s0 + pick(counts, ks, m)
        acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for pos in range(s0, s1):
            r = lo + tl.load(ORDER + pid * CMAX + pos).to(tl.int64)
            acc += tl.load(DR + r * stride_dr + cols, mask=cols < H, other=0.0).to(tl.float32)
        tl.store(PD + (pid.to(tl.int64) * M + m) * H + cols, acc, mask=cols < H)


@triton.jit(do_not_specialize=["n_programs"])
def _gather_reduce_kernel(PD, DT, n_programs, H: tl.constexpr, M, stride_dt, BLOCK_C: tl.constexpr,
                          P_TILE: tl.constexpr, BY_HAND: tl.constexpr):
    """Program (c, m): table row m's gradient for column block c."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    m = tl.program_id(1)
    total = sum_partials(PD + m * H, n_programs, M * H, cols, col_ok, P_TILE)
    tl.store(DT + m * stride_dt + cols, rounded(total, DT.dtype.element_ty, BY_HAND), mask=col_ok)


def table_gradient(row_grads: torch.Tensor, idx: torch.Tensor, table_rows: int) -> torch.Tensor:
    """sum of row_grads[r] over the rows r with idx[r] = m, for every m, in a fixed order."""
    rows, hidden = row_grads.shape
    device = row_grads.device
    if table_rows * hidden >= 2 ** 31:
        raise ValueError(f"a table of {table_rows} rows of {hidden} is too large for int32 offsets")
    if rows == 0:
        return torch.zeros((table_rows, hidden), dtype=row_grads.dtype, device=device)
    idx = idx if idx.stride(0) == 1 else idx.contiguous()  # local_order reads the index at unit stride
    out = torch.empty((table_rows, hidden), dtype=row_grads.dtype, device=device)
    cfg = K.launch_config(hidden)
    programs, chunk = K.backward_split(rows, cfg, device)
    cmax = next_power_of_2(chunk)
    order = torch.empty((programs * cmax,), dtype=torch.int32, device=device)
    partials = torch.empty((programs, table_rows, hidden), dtype=torch.float32, device=device)
    launch(_gather_partials_kernel, (programs,), row_grads, idx, order, partials, rows, hidden, table_rows,
           row_grads.stride(0), chunk, BLOCK_H=cfg.block_h, CMAX=cmax,
           K_P2=next_power_of_2(table_rows + 2), num_warps=cfg.bwd_warps)
    launch(_gather_reduce_kernel, (cdiv(hidden, cfg.param_cols), table_rows), partials, out, programs, hidden,
           table_rows, out.stride(0), BLOCK_C=cfg.param_cols, P_TILE=param_tile(programs, cfg.param_tile),
           BY_HAND=BY_HAND, num_warps=4)
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
