"""norm_modulate in Triton: batch-invariant, deterministic, fp32 inside, one rounding per output.

    y = xhat * a[m] + sh[m],   xhat = x * rstd,  rstd = 1 / sqrt(sum(x^2) / H + eps),  a[m] = w * (1 + sc[m])
    dx = (g - xhat * c) * rstd,   g = dy * a[m],  c = sum(g * xhat) / H
    dsh[m] = D[m],  dsc[m] = w * S[m],  dw = sum over m of (1 + sc[m]) * S[m]
    where D[m] = sum of dy and S[m] = sum of dy * xhat over the rows r with idx[r] = m.

Two shapes of kernel, picked by H alone (`launch_config`): narrow rows (BLOCK_H < WIDE_FROM) are
processed as [ROWS, BLOCK_H] tiles; wide rows (the model's H = 5376) one row at a time, because a
wide row already fills a program and the work that matters there is keeping memory busy.

Reduction orders (the point of this kernel: change them only with the probes rerun):

* Per row, forward and dx: each sum over H is a `tl.sum` over the row's block (axis 1 of the
  [ROWS, BLOCK_H] tile for narrow rows; for wide rows, the forward's sum of squares is the sum over
  the first HEAD columns plus the sum over the rest, and dx's sum is over one BLOCK_H vector). Each thread
  adds its own contiguous elements left to right, lanes combine by butterfly shuffles, warps through
  shared memory. The tile shape and warp count depend on H only, and every row of a tile has the same
  layout, so nothing in that tree depends on the batch, the grid or the row's position: a row's y and
  dx are bitwise the same alone or in any batch.
* Parameter gradients are cross-row sums, made without atomics in a fixed order. The backward's rows
  are split into fixed chunks (`backward_split`: a function of R and the GPU's SM count), one per
  program. A program first sorts its chunk by table row with a stable counting sort
  (`local_order`), then walks table rows m = 0 .. M - 1 in turn and, for each, its rows of m in
  ascending row order, accumulating per column in fp32 D and S, and writes them as partial row
  [program, m] (zeros when it has none); its dw partial adds (1 + sc[m]) * S[m] over m ascending.
  `_bwd_params_kernel` then adds, per column, the partials of programs 0, 1, ... (for each m, and
  for dw) in tiles of P_TILE (a fixed tl.sum tree per tile, tiles left to right). These orders depend on (idx, R, H, the
  device's SM count) only, so the gradients repeat bitwise run to run. No separate sorting launch:
  each launch costs the host more than the sort costs the GPU (kernels/NOTES.md, v12).

Rows whose index is outside [0, M) are sorted into an extra segment M: their y and dx are NaN and
they add nothing to the parameter gradients (the op checks indices before launch unless told not to).
All arithmetic is fp32; every output is rounded once, to nearest even, at its store.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from kernels.common import (BY_HAND, launch, local_order, param_tile, pick, program_rows, rounded, segment,
                            split_rows, sum_partials)

MAX_HIDDEN = 32768
WIDE_FROM = 2048          # BLOCK_H from which rows are processed one at a time
TILE_ELEMENTS = 4096      # narrow rows: rows per tile = TILE_ELEMENTS // BLOCK_H


@dataclass(frozen=True)
class LaunchConfig:
    """How the kernels are launched for one H. Part of the reduction order (tile shape, warps, the
    backward's split), so a function of H and the device only; tools/bench_norm_modulate.py passes
    variants of it to compare them."""

    block_h: int
    rows: int                 # rows per tile (narrow) or 1 (wide)
    wide: bool
    fwd_warps: int
    bwd_warps: int
    bwd_programs_per_sm: int  # wide rows: one program holds an SM's registers (kernels/NOTES.md)
    chunk_limit: int = 1024   # backward: rows per program at most (its sort is a [CHUNK, M + 2] one-hot)
    param_cols: int = 32      # parameter stage: columns per program
    param_tile: int = 256     # parameter stage: partial rows per tl.sum, at most


@functools.lru_cache(maxsize=64)
def launch_config(hidden: int) -> LaunchConfig:
    """The tuned launch configuration for rows of `hidden` elements (see the module docstring)."""
    block_h = triton.next_power_of_2(hidden)
    wide = block_h >= WIDE_FROM
    rows = 1 if wide else max(1, min(64, TILE_ELEMENTS // block_h))
    warps = 8 if wide else max(1, min(8, rows * block_h // 512))
    # Wide forward: 4 warps, 188 us against 193 us with 8 at H = 5376 (kernels/NOTES.md, v13).
    return LaunchConfig(block_h=block_h, rows=rows, wide=wide, fwd_warps=4 if wide else warps, bwd_warps=warps,
                        bwd_programs_per_sm=1 if wide else 4)


# --- forward -----------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["n_rows"])
def _fwd_tile_kernel(X, W, SH, SC, IDX, Y, RSTD, n_rows, H: tl.constexpr, M, stride_x, stride_y, stride_sh, stride_sc,
                     eps, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, SAVE_RSTD: tl.constexpr,
                     BY_HAND: tl.constexpr):
    """Narrow rows: a [ROWS, BLOCK_H] tile of consecutive rows, table rows gathered per row."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    row_ok = rows < n_rows
    col_ok = cols < H
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    seg = segment(tl.load(IDX + rows, mask=row_ok, other=0), row_ok, M)
    good = seg < M
    m = tl.minimum(seg, M - 1).to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sh = tl.load(SH + m[:, None] * stride_sh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sc = tl.load(SC + m[:, None] * stride_sc + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
    y = (x * rstd[:, None]) * (w[None, :] * (1.0 + sc)) + sh
    y = tl.where(good[:, None], y, float("nan"))
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], rounded(y, Y.dtype.element_ty, BY_HAND), mask=mask)
    if SAVE_RSTD:
        tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit
def _modulate_store(Y, W, SH, SC, row, m, cols, x, rstd, H: tl.constexpr, stride_y, stride_sh, stride_sc,
                    BY_HAND: tl.constexpr):
    ok = cols < H
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    sc = tl.load(SC + m * stride_sc + cols, mask=ok, other=0.0).to(tl.float32)
    sh = tl.load(SH + m * stride_sh + cols, mask=ok, other=0.0).to(tl.float32)
    y = (x * rstd) * (w * (1.0 + sc)) + sh
    tl.store(Y + row * stride_y + cols, rounded(y, Y.dtype.element_ty, BY_HAND), mask=ok)


@triton.jit(do_not_specialize=["n_rows"])
def _fwd_row_kernel(X, W, SH, SC, IDX, Y, RSTD, n_rows, H: tl.constexpr, M, stride_x, stride_y, stride_sh,
                    stride_sc, eps, HEAD: tl.constexpr, TAIL: tl.constexpr, SAVE_RSTD: tl.constexpr,
                    BY_HAND: tl.constexpr):
    """Wide rows: one row per program, held as a HEAD-wide block (the largest power of two <= H; its
    mask folds away at compile time) and a TAIL-wide block for the rest, so H = 5376 computes on 4096 + 2048 lanes instead of 8192.
    Sum of squares: the HEAD block's tl.sum, plus the TAIL block's tl.sum, in that order. Simple on
    purpose: grouping rows by table row to keep sh and sc in registers measured no faster
    (213 us against 191 us at R = 32768: kernels/NOTES.md)."""
    row = tl.program_id(0).to(tl.int64)
    seg = segment(tl.load(IDX + row), row < n_rows, M)
    m = tl.minimum(seg, M - 1).to(tl.int64)
    head = tl.arange(0, HEAD)
    tail = HEAD + tl.arange(0, TAIL)
    x_head = tl.load(X + row * stride_x + head, mask=head < H, other=0.0).to(tl.float32)  # mask folds away
    x_tail = tl.load(X + row * stride_x + tail, mask=tail < H, other=0.0).to(tl.float32)
    ss = tl.sum(x_head * x_head, axis=0) + tl.sum(x_tail * x_tail, axis=0)
    rstd = 1.0 / tl.sqrt(ss / H + eps)
    rstd = tl.where(seg < M, rstd, float("nan"))  # a bad index makes the whole row NaN
    _modulate_store(Y, W, SH, SC, row, m, head, x_head, rstd, H, stride_y, stride_sh, stride_sc, BY_HAND)
    _modulate_store(Y, W, SH, SC, row, m, tail, x_tail, rstd, H, stride_y, stride_sh, stride_sc, BY_HAND)
    if SAVE_RSTD:
        tl.store(RSTD + row, rstd)


# --- the backward: each program sorts its own rows by table row ---------------------------------------

@triton.jit
def _segment_scale(W, SC, k, M, cols, col_ok, stride_sc):
    """a = w * (1 + sc[k]) for segment k; NaN for the bad-index segment, so its dx is NaN."""
    m = tl.minimum(k, M - 1).to(tl.int64)
    a = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) * \
        (1.0 + tl.load(SC + m * stride_sc + cols, mask=col_ok, other=0.0).to(tl.float32))
    return tl.where(k < M, a, float("nan"))


@triton.jit
def _segment_begin(starts, counts, k, W, SC, M, cols, col_ok, stride_sc, K_P2: tl.constexpr):
    """Segment k's slice [s0, s1) of the sorted list, and its scale a = w * (1 + sc[k])."""
    ks = tl.arange(0, K_P2)
    s0 = pick(starts, ks, k)
    return s0, s0 + pick(counts, ks, k), _segment_scale(W, SC, k, M, cols, col_ok, stride_sc)


@triton.jit
def _store_partials(PART, SC, pid, k, M, cols, col_ok, H: tl.constexpr, stride_sc, acc_d, acc_s, acc_w):
    """End of this program's rows of table row k (none is fine: zeros). PART is [programs, 2M + 1, H]
    fp32: rows 0..M-1 hold D[k], rows M..2M-1 S[k], row 2M the program's dw partial, the sum over
    k ascending of (1 + sc[k]) * S[k], kept in registers (acc_w) until the program ends: adding it
    to memory at each segment's end measured 24 us slower (kernels/NOTES.md, v13). The bad-index
    segment k = M adds nothing."""
    base = PART + pid.to(tl.int64) * ((2 * M + 1) * H)
    written = cols < tl.where(k < M, H, 0)
    tl.store(base + k * H + cols, acc_d, mask=written)
    tl.store(base + (M + k) * H + cols, acc_s, mask=written)
    sc = tl.load(SC + tl.minimum(k, M - 1).to(tl.int64) * stride_sc + cols, mask=col_ok, other=0.0).to(tl.float32)
    return acc_w + tl.where(k < M, (1.0 + sc) * acc_s, 0.0)


@triton.jit(do_not_specialize=["n_rows"])
def _bwd_tile_kernel(X, DY, DX, W, SC, RSTD, IDX, ORDER, PART, n_rows, H: tl.constexpr, M, stride_x,
                     stride_dy, stride_dx, stride_sc, CHUNK, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
                     CMAX: tl.constexpr, K_P2: tl.constexpr, BY_HAND: tl.constexpr):
    """Narrow rows: this program's CHUNK rows, segment by segment, ROWS sorted rows per step."""
    pid, lo, n, starts, counts = program_rows(IDX, ORDER, n_rows, M, CHUNK, CMAX, K_P2)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    acc_w = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in range(0, M + 1):
        s0, s1, a = _segment_begin(starts, counts, k, W, SC, M, cols, col_ok, stride_sc, K_P2)
        acc_d = tl.zeros((BLOCK_H,), dtype=tl.float32)
        acc_s = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for start in range(s0, s1, ROWS):
            pos = start + tl.arange(0, ROWS)
            row_ok = pos < s1
            r = lo + tl.load(ORDER + pid * CMAX + pos, mask=row_ok, other=0).to(tl.int64)
            mask = row_ok[:, None] & col_ok[None, :]
            x = tl.load(X + r[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + r[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + r, mask=row_ok, other=0.0)
            xhat = x * rstd[:, None]
            g = dy * a[None, :]
            c = tl.sum(g * xhat, axis=1) / H
            dx = (g - xhat * c[:, None]) * rstd[:, None]
            tl.store(DX + r[:, None] * stride_dx + cols[None, :], rounded(dx, DX.dtype.element_ty, BY_HAND),
                     mask=mask)
            acc_d += tl.sum(dy, axis=0)
            acc_s += tl.sum(dy * xhat, axis=0)
        acc_w = _store_partials(PART, SC, pid, k, M, cols, col_ok, H, stride_sc, acc_d, acc_s, acc_w)
    tl.store(PART + pid.to(tl.int64) * ((2 * M + 1) * H) + 2 * M * H + cols, acc_w, mask=col_ok)


@triton.jit(do_not_specialize=["n_rows"])
def _bwd_row_kernel(X, DY, DX, W, SC, RSTD, IDX, ORDER, PART, n_rows, H: tl.constexpr, M, stride_x,
                    stride_dy, stride_dx, stride_sc, CHUNK, BLOCK_H: tl.constexpr, CMAX: tl.constexpr,
                    K_P2: tl.constexpr, BY_HAND: tl.constexpr):
    """Wide rows: this program's CHUNK rows, segment by segment, a row per step; the next row's x and
    dy (in the sorted list, across segment ends) are loaded before this row's arithmetic (1.5x over
    loading them in turn: kernels/NOTES.md)."""
    pid, lo, n, starts, counts = program_rows(IDX, ORDER, n_rows, M, CHUNK, CMAX, K_P2)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    order = ORDER + pid * CMAX
    # Scalar masks are written as index clamps and column limits: the interpreter rejects them.
    r_next = lo + tl.load(order).to(tl.int64)
    x_next = tl.load(X + r_next * stride_x + cols, mask=col_ok, other=0.0)
    dy_next = tl.load(DY + r_next * stride_dy + cols, mask=col_ok, other=0.0)
    acc_w = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in range(0, M + 1):
        s0, s1, a = _segment_begin(starts, counts, k, W, SC, M, cols, col_ok, stride_sc, K_P2)
        acc_d = tl.zeros((BLOCK_H,), dtype=tl.float32)
        acc_s = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for pos in range(s0, s1):
            r = r_next
            x = x_next.to(tl.float32)
            dy = dy_next.to(tl.float32)
            limit = tl.where(pos + 1 < n, H, 0)
            r_next = lo + tl.load(order + tl.minimum(pos + 1, n - 1)).to(tl.int64)
            x_next = tl.load(X + r_next * stride_x + cols, mask=cols < limit, other=0.0)
            dy_next = tl.load(DY + r_next * stride_dy + cols, mask=cols < limit, other=0.0)
            rstd = tl.load(RSTD + r)
            xhat = x * rstd
            g = dy * a
            c = tl.sum(g * xhat, axis=0) / H
            dx = (g - xhat * c) * rstd
            tl.store(DX + r * stride_dx + cols, rounded(dx, DX.dtype.element_ty, BY_HAND), mask=col_ok)
            acc_d += dy
            acc_s += dy * xhat
        acc_w = _store_partials(PART, SC, pid, k, M, cols, col_ok, H, stride_sc, acc_d, acc_s, acc_w)
    tl.store(PART + pid.to(tl.int64) * ((2 * M + 1) * H) + 2 * M * H + cols, acc_w, mask=col_ok)


@triton.jit(do_not_specialize=["n_programs"])
def _bwd_params_kernel(PART, W, DW, DSH, DSC, n_programs, H: tl.constexpr, M, stride_dsh, stride_dsc,
                       BLOCK_C: tl.constexpr, P_TILE: tl.constexpr, BY_HAND: tl.constexpr):
    """Program (c, m): dsh[m] and dsc[m] for column block c; program (c, M): dw. Each sums one
    partial row of every backward program (`sum_partials`), so all run at once."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    m = tl.program_id(1)
    stride = (2 * M + 1) * H
    if m < M:
        d = sum_partials(PART + m * H, n_programs, stride, cols, col_ok, P_TILE)
        s = sum_partials(PART + (M + m) * H, n_programs, stride, cols, col_ok, P_TILE)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        tl.store(DSH + m * stride_dsh + cols, rounded(d, DSH.dtype.element_ty, BY_HAND), mask=col_ok)
        tl.store(DSC + m * stride_dsc + cols, rounded(w * s, DSC.dtype.element_ty, BY_HAND), mask=col_ok)
    else:
        dw = sum_partials(PART + 2 * M * H, n_programs, stride, cols, col_ok, P_TILE)
        tl.store(DW + cols, rounded(dw, DW.dtype.element_ty, BY_HAND), mask=col_ok)


# --- launchers ---------------------------------------------------------------------------------------

def forward(x2d: torch.Tensor, w: torch.Tensor, sh: torch.Tensor, sc: torch.Tensor, idx: torch.Tensor,
            eps: float, save_rstd: bool = True, config: Optional[LaunchConfig] = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    rows, hidden = x2d.shape
    y = torch.empty((rows, hidden), dtype=x2d.dtype, device=x2d.device)
    # Without a backward, rstd is never written (SAVE_RSTD is a constexpr): y stands in for its pointer.
    rstd = torch.empty((rows,), dtype=torch.float32, device=x2d.device) if save_rstd else y
    if rows == 0:
        return y, rstd
    cfg = config or launch_config(hidden)
    args = (x2d, w, sh, sc, idx, y, rstd, rows, hidden, sh.shape[0], x2d.stride(0), y.stride(0), sh.stride(0),
            sc.stride(0), eps)
    if cfg.wide:
        head = 1 << (hidden.bit_length() - 1)
        tail = triton.next_power_of_2(max(1, hidden - head))
        launch(_fwd_row_kernel, (rows,), *args, HEAD=head, TAIL=tail, SAVE_RSTD=save_rstd, BY_HAND=BY_HAND,
               num_warps=cfg.fwd_warps)
    else:
        launch(_fwd_tile_kernel, (triton.cdiv(rows, cfg.rows),), *args, BLOCK_H=cfg.block_h, ROWS=cfg.rows,
               SAVE_RSTD=save_rstd, BY_HAND=BY_HAND, num_warps=cfg.fwd_warps)
    return y, rstd


def backward_split(rows: int, cfg: LaunchConfig, device: torch.device) -> tuple[int, int]:
    """(programs, rows per program) of the backward (`split_rows`)."""
    return split_rows(rows, device, cfg.bwd_programs_per_sm, cfg.chunk_limit)


def backward(dy: torch.Tensor, x2d: torch.Tensor, w: torch.Tensor, sc: torch.Tensor, idx: torch.Tensor,
             rstd: torch.Tensor, table_rows: int, sh_dtype: torch.dtype, need_params: bool,
             config: Optional[LaunchConfig] = None
             ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    rows, hidden = x2d.shape
    device = x2d.device
    dx = torch.empty((rows, hidden), dtype=x2d.dtype, device=device)
    if rows == 0:
        return (dx, torch.zeros_like(w), torch.zeros((table_rows, hidden), dtype=sh_dtype, device=device),
                torch.zeros((table_rows, hidden), dtype=sc.dtype, device=device))
    if (2 * table_rows + 1) * hidden >= 2 ** 31:
        raise ValueError(f"tables of {table_rows} rows of {hidden} are too large for this kernel's int32 offsets")
    cfg = config or launch_config(hidden)
    programs, chunk = backward_split(rows, cfg, device)
    cmax = triton.next_power_of_2(chunk)
    order = torch.empty((programs * cmax,), dtype=torch.int32, device=device)
    partials = torch.empty((programs, 2 * table_rows + 1, hidden), dtype=torch.float32, device=device)
    args = (x2d, dy, dx, w, sc, rstd, idx, order, partials, rows, hidden, table_rows, x2d.stride(0),
            dy.stride(0), dx.stride(0), sc.stride(0), chunk)
    k_p2 = triton.next_power_of_2(table_rows + 2)
    if cfg.wide:
        launch(_bwd_row_kernel, (programs,), *args, BLOCK_H=cfg.block_h, CMAX=cmax, K_P2=k_p2,
               BY_HAND=BY_HAND, num_warps=cfg.bwd_warps)
    else:
        launch(_bwd_tile_kernel, (programs,), *args, BLOCK_H=cfg.block_h, ROWS=cfg.rows, CMAX=cmax, K_P2=k_p2,
               BY_HAND=BY_HAND, num_warps=cfg.bwd_warps)
    if not need_params:
        return dx, None, None, None
    dw = torch.empty_like(w)
    if sh_dtype == sc.dtype:
        dsh, dsc = torch.empty((2, table_rows, hidden), dtype=sc.dtype, device=device)
    else:
        dsh = torch.empty((table_rows, hidden), dtype=sh_dtype, device=device)
        dsc = torch.empty((table_rows, hidden), dtype=sc.dtype, device=device)
    launch(_bwd_params_kernel, (triton.cdiv(hidden, cfg.param_cols), table_rows + 1), partials, w, dw, dsh, dsc,
           programs, hidden, table_rows, dsh.stride(0), dsc.stride(0), BLOCK_C=cfg.param_cols,
           P_TILE=param_tile(programs, cfg.param_tile), BY_HAND=BY_HAND, num_warps=4)
    return dx, dw, dsh, dsc
