"""norm_modulate in Triton: batch-invariant, deterministic, fp32 inside, one rounding per output.

    y = xhat * a[m] + sh[m],   xhat = x * rstd,  rstd = 1 / sqrt(sum(x^2) / H + eps),  a[m] = w * (1 + sc[m])
    dx = (g - xhat * c) * rstd,   g = dy * a[m],  c = sum(g * xhat) / H
    dsh[m] = D[m],  dsc[m] = w * S[m],  dw = sum over m of (1 + sc[m]) * S[m]
    where D[m] = sum of dy and S[m] = sum of dy * xhat over the rows r with idx[r] = m.

Two shapes of kernel, picked by H alone (`block_config`): narrow rows (BLOCK_H < WIDE_FROM) are
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
* Parameter gradients are cross-row sums, made without atomics in a fixed order. A counting sort
  (`segment_plan`: per-block counts, then each block's prefix summed in block order) lists the rows
  of each table row m in ascending row order; that segment is cut into chunks of CHUNK rows, one
  program each. A program walks its chunk in order and accumulates, per column in fp32, D and S, and
  writes them as one partial row. `_bwd_params_kernel` then adds, per column and per m in ascending
  order, the partials of m's chunks in tiles of P_TILE (a fixed tl.sum tree per tile, tiles left to
  right), and dw adds (1 + sc[m]) * S[m] over m ascending. These orders depend on (idx, R, H, the
  device's SM count) only, so the gradients repeat bitwise run to run.

Rows whose index is outside [0, M) are sorted into an extra segment M: their y and dx are NaN and
they add nothing to the parameter gradients (the op checks indices before launch unless told not to).
All arithmetic is fp32; every output is rounded once, to nearest even, at its store.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

MAX_HIDDEN = 32768
WIDE_FROM = 2048          # BLOCK_H from which rows are processed one at a time
TILE_ELEMENTS = 4096      # narrow rows: rows per tile = TILE_ELEMENTS // BLOCK_H
PROGRAMS_PER_SM = 4       # backward: about this many row chunks per SM (measured: kernels/NOTES.md)
PARAM_COLS = 16           # parameter stage: columns per program
PARAM_TILE = 64           # parameter stage: partial rows per tl.sum
PLAN_MAX_BLOCKS = 256     # counting sort: at most this many blocks (each sums the others' counts)


@dataclass(frozen=True)
class BlockConfig:
    block_h: int
    rows: int          # rows per tile (narrow) or 1 (wide)
    wide: bool
    fwd_warps: int
    bwd_warps: int


WARPS_OVERRIDE: dict[str, int] = {}  # kernels/bench.py pins warps to compare variants


def block_config(hidden: int) -> BlockConfig:
    """Tile shape and warps for a row of `hidden` elements: a function of H only (see above)."""
    block_h = triton.next_power_of_2(hidden)
    wide = block_h >= WIDE_FROM
    rows = 1 if wide else max(1, min(64, TILE_ELEMENTS // block_h))
    warps = 8 if wide else max(1, min(8, rows * block_h // 512))
    return BlockConfig(block_h=block_h, rows=rows, wide=wide, fwd_warps=WARPS_OVERRIDE.get("fwd", warps),
                       bwd_warps=WARPS_OVERRIDE.get("bwd", warps))


@triton.jit
def _rounded(v, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    """fp32 -> `dtype`, rounding to nearest even. The GPU's cast does that; the Triton interpreter's
    fp32 -> bf16 cast truncates, so there (BY_HAND) the rounding is done on the bits first and the
    cast is exact. The hand version costs 17 us per forward on the H200 (kernels/NOTES.md)."""
    if BY_HAND:
        if dtype == tl.bfloat16:
            bits = v.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            v = tl.where(v != v, v, bits.to(tl.float32, bitcast=True))  # NaN stays NaN
    return v.to(dtype)


@triton.jit
def _segment(idx, ok, M):
    """Segment of each row: its table row, M for an index out of range, M + 1 for padding."""
    seg = tl.where((idx < 0) | (idx >= M), M, idx).to(tl.int32)  # compared as loaded: no wrap
    return tl.where(ok, seg, M + 1)


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
    seg = _segment(tl.load(IDX + rows, mask=row_ok, other=0), row_ok, M)
    good = seg < M
    m = tl.minimum(seg, M - 1).to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sh = tl.load(SH + m[:, None] * stride_sh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sc = tl.load(SC + m[:, None] * stride_sc + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
    y = (x * rstd[:, None]) * (w[None, :] * (1.0 + sc)) + sh
    y = tl.where(good[:, None], y, float("nan"))
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], _rounded(y, Y.dtype.element_ty, BY_HAND), mask=mask)
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
    tl.store(Y + row * stride_y + cols, _rounded(y, Y.dtype.element_ty, BY_HAND), mask=ok)


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
    seg = _segment(tl.load(IDX + row), row < n_rows, M)
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


# --- the counting sort behind the backward's fixed reduction order -----------------------------------

@triton.jit
def _plan_count_kernel(IDX, COUNTS, n_rows, M, BLOCK: tl.constexpr, K_P2: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n_rows
    seg = _segment(tl.load(IDX + rows, mask=ok, other=0), ok, M)
    ks = tl.arange(0, K_P2)
    counts = tl.sum((seg[:, None] == ks[None, :]).to(tl.int32), axis=0)
    tl.store(COUNTS + tl.program_id(0) * K_P2 + ks, counts)


@triton.jit
def _plan_scatter_kernel(IDX, COUNTS, PERM, SEG_START, CHUNK_START, n_rows, M, n_blocks, CHUNK,
                         BLOCK: tl.constexpr, K_P2: tl.constexpr, NB_P2: tl.constexpr):
    """Stable counting sort: row r goes to seg_start[m] + (rows of m in earlier blocks) + (rows of m
    before r in its block). Every block sums the earlier blocks' counts itself: no atomics, no order
    between programs."""
    b = tl.program_id(0)
    blocks = tl.arange(0, NB_P2)
    ks = tl.arange(0, K_P2)
    counts = tl.load(COUNTS + blocks[:, None] * K_P2 + ks[None, :], mask=(blocks < n_blocks)[:, None], other=0)
    real = ks <= M                                    # segments 0..M; M + 1 is padding
    totals = tl.where(real, tl.sum(counts, axis=0), 0)
    seg_start = tl.cumsum(totals, axis=0) - totals
    earlier = tl.sum(tl.where((blocks < b)[:, None], counts, 0), axis=0)

    rows = b * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n_rows
    seg = _segment(tl.load(IDX + rows, mask=ok, other=0), ok, M)
    onehot = (seg[:, None] == ks[None, :]).to(tl.int32)
    rank = tl.sum((tl.cumsum(onehot, axis=0) - onehot) * onehot, axis=1)
    start = tl.sum(onehot * (seg_start + earlier)[None, :], axis=1)
    tl.store(PERM + start + rank, rows, mask=ok)

    chunks = (totals + CHUNK - 1) // CHUNK
    first = ks <= tl.where(b == 0, M + 1, -1)         # block 0 writes the M + 2 segment bounds
    tl.store(SEG_START + ks, seg_start, mask=first)
    tl.store(CHUNK_START + ks, tl.cumsum(chunks, axis=0) - chunks, mask=first)


@dataclass(frozen=True)
class SegmentPlan:
    """`perm`: rows grouped by segment (0..M-1 table rows, M bad index), ascending within each;
    `seg_start[k]` / `chunk_start[k]`: where segment k's rows / programs begin (k = 0..M+1)."""

    perm: torch.Tensor
    seg_start: torch.Tensor
    chunk_start: torch.Tensor
    chunk: int
    programs: int


def segment_plan(idx: torch.Tensor, table_rows: int, chunk: int) -> SegmentPlan:
    rows, device = idx.numel(), idx.device
    k_p2 = triton.next_power_of_2(table_rows + 2)
    block = max(1024, triton.next_power_of_2(triton.cdiv(rows, PLAN_MAX_BLOCKS)))
    n_blocks = triton.cdiv(rows, block)
    # One allocation for counts, perm and the two bound vectors: each tensor op costs host time.
    scratch = torch.empty((n_blocks * k_p2 + rows + 2 * k_p2,), dtype=torch.int32, device=device)
    counts = scratch[:n_blocks * k_p2]
    perm = scratch[n_blocks * k_p2:n_blocks * k_p2 + rows]
    bounds = scratch[n_blocks * k_p2 + rows:].view(2, k_p2)
    _plan_count_kernel[(n_blocks,)](idx, counts, rows, table_rows, BLOCK=block, K_P2=k_p2, num_warps=8)
    _plan_scatter_kernel[(n_blocks,)](idx, counts, perm, bounds[0], bounds[1], rows, table_rows, n_blocks, chunk,
                                      BLOCK=block, K_P2=k_p2, NB_P2=triton.next_power_of_2(n_blocks), num_warps=8)
    if device.type == "cuda":
        # Each of the M + 1 segments wastes at most one partly filled chunk: a bound without a sync.
        programs = triton.cdiv(rows, chunk) + table_rows + 1
    else:
        programs = int(bounds[1, table_rows + 1])  # the interpreter: a sync is free, idle programs are not
    return SegmentPlan(perm=perm, seg_start=bounds[0], chunk_start=bounds[1], chunk=chunk, programs=programs)


# --- backward ----------------------------------------------------------------------------------------

@triton.jit
def _chunk_of(pid, SEG_START, CHUNK_START, M, CHUNK, K_P2: tl.constexpr):
    """This program's segment k and its rows [lo, hi) in the plan's sorted order."""
    ks = tl.arange(0, K_P2)
    ends = tl.load(CHUNK_START + 1 + ks, mask=ks <= M, other=2147483647)
    k = tl.sum((ends <= pid).to(tl.int32), axis=0)   # M + 1: past the last chunk
    k_safe = tl.minimum(k, M)
    lo = tl.load(SEG_START + k_safe) + (pid - tl.load(CHUNK_START + k_safe)) * CHUNK
    hi = tl.where(k <= M, tl.minimum(lo + CHUNK, tl.load(SEG_START + k_safe + 1)), lo)
    return k, lo, hi


@triton.jit
def _segment_scale(W, SC, k, M, cols, col_ok, stride_sc):
    """a = w * (1 + sc[k]) for a program's segment k; NaN for the bad-index segment, so its dx is NaN."""
    m = tl.minimum(k, M - 1).to(tl.int64)
    a = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) * \
        (1.0 + tl.load(SC + m * stride_sc + cols, mask=col_ok, other=0.0).to(tl.float32))
    return tl.where(k < M, a, float("nan"))


@triton.jit
def _store_partials(PD, PS, pid, k, M, cols, H: tl.constexpr, acc_d, acc_s):
    """This program's partial D and S row; bad-index rows and idle programs add nothing."""
    out = pid.to(tl.int64) * H + cols
    written = cols < tl.where(k < M, H, 0)
    tl.store(PD + out, acc_d, mask=written)
    tl.store(PS + out, acc_s, mask=written)


@triton.jit(do_not_specialize=["n_rows"])
def _bwd_tile_kernel(X, DY, DX, W, SC, RSTD, PERM, SEG_START, CHUNK_START, PD, PS, n_rows, H: tl.constexpr, M, stride_x,
                     stride_dy, stride_dx, stride_sc, CHUNK, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
                     K_P2: tl.constexpr, BY_HAND: tl.constexpr):
    """Narrow rows: one chunk of one segment, ROWS sorted rows per step."""
    pid = tl.program_id(0)
    k, lo, hi = _chunk_of(pid, SEG_START, CHUNK_START, M, CHUNK, K_P2)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    a = _segment_scale(W, SC, k, M, cols, col_ok, stride_sc)
    acc_d = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc_s = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for start in range(lo, hi, ROWS):
        pos = start + tl.arange(0, ROWS)
        row_ok = pos < hi
        r = tl.load(PERM + pos, mask=row_ok, other=0).to(tl.int64)
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(X + r[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + r[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + r, mask=row_ok, other=0.0)
        xhat = x * rstd[:, None]
        g = dy * a[None, :]
        c = tl.sum(g * xhat, axis=1) / H
        dx = (g - xhat * c[:, None]) * rstd[:, None]
        tl.store(DX + r[:, None] * stride_dx + cols[None, :], _rounded(dx, DX.dtype.element_ty, BY_HAND), mask=mask)
        acc_d += tl.sum(dy, axis=0)
        acc_s += tl.sum(dy * xhat, axis=0)
    _store_partials(PD, PS, pid, k, M, cols, H, acc_d, acc_s)


@triton.jit(do_not_specialize=["n_rows"])
def _bwd_row_kernel(X, DY, DX, W, SC, RSTD, PERM, SEG_START, CHUNK_START, PD, PS, n_rows, H: tl.constexpr, M, stride_x,
                    stride_dy, stride_dx, stride_sc, CHUNK, BLOCK_H: tl.constexpr, K_P2: tl.constexpr,
                    BY_HAND: tl.constexpr):
    """Wide rows: one chunk of one segment, a row per step, the next row's x and dy loaded before
    this row's arithmetic (1.5x over loading them in turn: kernels/NOTES.md)."""
    pid = tl.program_id(0)
    k, lo, hi = _chunk_of(pid, SEG_START, CHUNK_START, M, CHUNK, K_P2)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    a = _segment_scale(W, SC, k, M, cols, col_ok, stride_sc)
    acc_d = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc_s = tl.zeros((BLOCK_H,), dtype=tl.float32)
    # Scalar masks are written as index clamps and column limits: the interpreter rejects them.
    limit = tl.where(lo < hi, H, 0)
    r_next = tl.load(PERM + tl.minimum(lo, n_rows - 1)).to(tl.int64)
    x_next = tl.load(X + r_next * stride_x + cols, mask=cols < limit, other=0.0)
    dy_next = tl.load(DY + r_next * stride_dy + cols, mask=cols < limit, other=0.0)
    for pos in range(lo, hi):
        r = r_next
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        limit = tl.where(pos + 1 < hi, H, 0)
        r_next = tl.load(PERM + tl.minimum(pos + 1, n_rows - 1)).to(tl.int64)
        x_next = tl.load(X + r_next * stride_x + cols, mask=cols < limit, other=0.0)
        dy_next = tl.load(DY + r_next * stride_dy + cols, mask=cols < limit, other=0.0)
        rstd = tl.load(RSTD + r)
        xhat = x * rstd
        g = dy * a
        c = tl.sum(g * xhat, axis=0) / H
        dx = (g - xhat * c) * rstd
        tl.store(DX + r * stride_dx + cols, _rounded(dx, DX.dtype.element_ty, BY_HAND), mask=col_ok)
        acc_d += dy
        acc_s += dy * xhat
    _store_partials(PD, PS, pid, k, M, cols, H, acc_d, acc_s)


@triton.jit
def sum_partials(P, c0, c1, cols, col_ok, H: tl.constexpr, P_TILE: tl.constexpr):
    """Partial rows c0..c1-1 of P summed per column in fp32: tiles of P_TILE rows, each by a fixed
    tl.sum tree, added left to right (shared with kernels/row_gather.py)."""
    acc = tl.zeros(cols.shape, dtype=tl.float32)
    for p0 in range(c0, c1, P_TILE):
        p = p0 + tl.arange(0, P_TILE)
        mask = (p < c1)[:, None] & col_ok[None, :]
        acc += tl.sum(tl.load(P + p.to(tl.int64)[:, None] * H + cols[None, :], mask=mask, other=0.0), axis=0)
    return acc


@triton.jit
def _bwd_params_kernel(PD, PS, CHUNK_START, W, SC, DW, DSH, DSC, H: tl.constexpr, M, stride_sc, stride_dsh, stride_dsc,
                       BLOCK_C: tl.constexpr, P_TILE: tl.constexpr, BY_HAND: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for m in range(0, M):
        c0 = tl.load(CHUNK_START + m)
        c1 = tl.load(CHUNK_START + m + 1)
        d = sum_partials(PD, c0, c1, cols, col_ok, H, P_TILE)
        s = sum_partials(PS, c0, c1, cols, col_ok, H, P_TILE)
        sc = tl.load(SC + m * stride_sc + cols, mask=col_ok, other=0.0).to(tl.float32)
        tl.store(DSH + m * stride_dsh + cols, _rounded(d, DSH.dtype.element_ty, BY_HAND), mask=col_ok)
        tl.store(DSC + m * stride_dsc + cols, _rounded(w * s, DSC.dtype.element_ty, BY_HAND), mask=col_ok)
        dw += (1.0 + sc) * s
    tl.store(DW + cols, _rounded(dw, DW.dtype.element_ty, BY_HAND), mask=col_ok)


# --- launchers ---------------------------------------------------------------------------------------

def interpreter_active() -> bool:
    """TRITON_INTERPRET is on: kernels run on the CPU, and bf16 stores are rounded by hand."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def forward(x2d: torch.Tensor, w: torch.Tensor, sh: torch.Tensor, sc: torch.Tensor, idx: torch.Tensor,
            eps: float, save_rstd: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    rows, hidden = x2d.shape
    y = torch.empty((rows, hidden), dtype=x2d.dtype, device=x2d.device)
    # Without a backward, rstd is never written (SAVE_RSTD is a constexpr): y stands in for its pointer.
    rstd = torch.empty((rows,), dtype=torch.float32, device=x2d.device) if save_rstd else y
    if rows == 0:
        return y, rstd
    cfg = block_config(hidden)
    args = (x2d, w, sh, sc, idx, y, rstd, rows, hidden, sh.shape[0], x2d.stride(0), y.stride(0), sh.stride(0),
            sc.stride(0), eps)
    if cfg.wide:
        head = 1 << (hidden.bit_length() - 1)
        tail = triton.next_power_of_2(max(1, hidden - head))
        _fwd_row_kernel[(rows,)](*args, HEAD=head, TAIL=tail, SAVE_RSTD=save_rstd, BY_HAND=interpreter_active(),
                                 num_warps=cfg.fwd_warps)
    else:
        _fwd_tile_kernel[(triton.cdiv(rows, cfg.rows),)](*args, BLOCK_H=cfg.block_h, ROWS=cfg.rows,
                                                         SAVE_RSTD=save_rstd, BY_HAND=interpreter_active(),
                                                         num_warps=cfg.fwd_warps)
    return y, rstd


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def backward_chunk(rows: int, cfg: BlockConfig, device: torch.device) -> int:
    """Rows per backward program: about PROGRAMS_PER_SM programs per SM, a whole number of tiles."""
    if device.type != "cuda":
        return triton.cdiv(rows, cfg.rows) * cfg.rows  # interpreter: one program per segment
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    per_program = triton.cdiv(rows, PROGRAMS_PER_SM * sms)
    return max(cfg.rows, triton.cdiv(per_program, cfg.rows) * cfg.rows)


def backward(dy: torch.Tensor, x2d: torch.Tensor, w: torch.Tensor, sc: torch.Tensor, idx: torch.Tensor,
             rstd: torch.Tensor, table_rows: int, sh_dtype: torch.dtype, need_params: bool
             ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    rows, hidden = x2d.shape
    device = x2d.device
    dx = torch.empty((rows, hidden), dtype=x2d.dtype, device=device)
    if rows == 0:
        return (dx, torch.zeros_like(w), torch.zeros((table_rows, hidden), dtype=sh_dtype, device=device),
                torch.zeros((table_rows, hidden), dtype=sc.dtype, device=device))
    cfg = block_config(hidden)
    plan = segment_plan(idx, table_rows, backward_chunk(rows, cfg, device))
    partial_d, partial_s = torch.empty((2, plan.programs, hidden), dtype=torch.float32, device=device)
    args = (x2d, dy, dx, w, sc, rstd, plan.perm, plan.seg_start, plan.chunk_start, partial_d, partial_s,
            rows, hidden, table_rows, x2d.stride(0), dy.stride(0), dx.stride(0), sc.stride(0), plan.chunk)
    k_p2 = triton.next_power_of_2(table_rows + 2)
    if cfg.wide:
        _bwd_row_kernel[(plan.programs,)](*args, BLOCK_H=cfg.block_h, K_P2=k_p2, BY_HAND=interpreter_active(),
                                          num_warps=cfg.bwd_warps)
    else:
        _bwd_tile_kernel[(plan.programs,)](*args, BLOCK_H=cfg.block_h, ROWS=cfg.rows, K_P2=k_p2,
                                           BY_HAND=interpreter_active(), num_warps=cfg.bwd_warps)
    if not need_params:
        return dx, None, None, None
    dw = torch.empty_like(w)
    if sh_dtype == sc.dtype:
        dsh, dsc = torch.empty((2, table_rows, hidden), dtype=sc.dtype, device=device)
    else:
        dsh = torch.empty((table_rows, hidden), dtype=sh_dtype, device=device)
        dsc = torch.empty((table_rows, hidden), dtype=sc.dtype, device=device)
    _bwd_params_kernel[(triton.cdiv(hidden, PARAM_COLS),)](
        partial_d, partial_s, plan.chunk_start, w, sc, dw, dsh, dsc, hidden, table_rows, sc.stride(0),
        dsh.stride(0), dsc.stride(0), BLOCK_C=PARAM_COLS, P_TILE=PARAM_TILE, BY_HAND=interpreter_active(), num_warps=4)
    return dx, dw, dsh, dsc
