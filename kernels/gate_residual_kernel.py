"""gate_residual in Triton: out = res + gate[idx] * y, batch-invariant, with a fixed-order gate gradient.

    out  = res + g * y,       g = gate[idx[r]]   (fp32 inside, one rounding to the promoted dtype)
    dres = dy                 (copied bit for bit; rounded once where res's dtype is narrower than out's)
    dy_  = g * dy             (exact in fp32 when both are 16-bit floats: one rounding)
    dgate[m] = sum of dy * y over the rows r with idx[r] = m   (fp32, fixed order, one rounding)

res, y and gate may each be bf16, fp16 or fp32 (each combination its own specialization); out is in their
promoted dtype, as torch's `res + gate[idx] * y`, and each gradient in its input's dtype.

Forward (`_fwd_kernel`, one launch): grid (row group, column block). A program owns BLOCK_C columns and
walks FWD_TILES tiles of FWD_ROWS consecutive rows; its gate working set is M x BLOCK_C elements
(4.6 KB at BLOCK_C = 256 in bf16), so the gathered gate rows stay in L1 and the memory traffic is
res, y and out (3 x 2H bytes per row) plus the index. Every element is computed by the same
instructions from (res, y, gate[idx]) alone: nothing depends on the batch, the grid or the position.
A row whose index is out of range comes out NaN.

Backward, two launches, no atomics:

1. `_bwd_kernel`, grid (P, NB): the rows are split into P chunks (`kernels.common.split_row_chunks`, a
   function of S, the column split and the GPU's SM count only); program (p, b) owns BLOCK_C columns of
   chunk p. It sorts the chunk's rows by table row (`kernels.common.local_order`, a stable counting
   sort) and walks table rows k = 0 .. M in turn (M: the bad-index rows, whose dy_ is NaN and which
   add nothing): g = gate[k] is loaded once, then the rows of k in ascending row order, BWD_ROWS per
   step, each step writing dres and dy_ for its rows and row slot i of a [BWD_ROWS, BLOCK_C] fp32
   accumulator adding dy * y of the row at sorted position start + i. At the end of k the slots are
   added by one fixed tl.sum tree and written as partial row [p, k] (zeros when the chunk has no row
   of k). dres and dy_ of each row depend on that row alone (batch-invariant); only the partials
   depend on the split.
2. `kernels.common.table_from_partials`: per column, the partials of chunks 0, 1, ..., P-1 in tiles of
   PARAM_TILE (a fixed tl.sum tree per tile, tiles left to right), rounded once to the gate's dtype.

dres is written by the backward kernel (one more store per element) rather than returned as dy itself:
autograd clones a returned dy when it accumulates into a leaf whose upstream gradient is still referenced
(the harness's case), a separate read and write of the same bytes: writing dres took ~10% less
forward+backward time on the H200 (kernels/notes/gate_residual.md, `dres_is_dy`, has the figures and the
command).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from h3bench.kernels.common import (BY_HAND, INTERPRETED, cdiv, launch, local_order, param_tile, pick, rounded, segment,
                            next_power_of_2, split_row_chunks, table_from_partials)


@dataclass(frozen=True)
class LaunchConfig:
    """How the kernels are launched for one H (`config_for`; tests pass smaller tiles and chunks). The
    backward's split is part of the gate gradient's summation order (a function of H and the device only)."""

    block_c: int                 # columns per program, forward (and backward unless bwd_block_c)
    fwd_rows: int                # forward: rows per tile
    fwd_tiles: int               # forward: tiles per program
    fwd_warps: int
    bwd_rows: int                # backward: sorted rows per step (accumulator slots)
    bwd_warps: int
    bwd_programs_per_sm: int     # backward: programs per SM in all (sets the row chunks)
    chunk_limit: int = 512       # backward: rows per chunk at most (its sort is a [chunk, M + 2] one-hot)
    reduce_cols: int = 64        # gate-gradient stage: columns per program
    param_tile: int = 256        # gate-gradient stage: partial rows per tl.sum, at most
    # backward columns per program when they differ from the forward's (`config_for`: 512-column backward
    # steps under 256-column forward tiles from H = 512 up)
    bwd_block_c: Optional[int] = None

    @property
    def bwd_columns(self) -> int:
        return self.bwd_block_c or self.block_c


@functools.lru_cache(maxsize=64)
def launch_config(hidden: int) -> LaunchConfig:
    """The default launch configuration for rows of `hidden` elements (`config_for`)."""
    return config_for(hidden, INTERPRETED)


def config_for(hidden: int, interpreted: bool) -> LaunchConfig:
    """On a GPU: [16, 256] forward tiles, 8 per program (4 warps: 32 elements per thread, 16-byte
    accesses); backward: [4, 512] steps from H = 512 up, [16, 256] below; 16 programs per SM, chunks of at
    most 512 rows. On the H200 at S = 32768, H = 5376 the [4, 512] steps took a fifth less backward time
    than [16, 256], and [16, 256] at 16 programs per SM less than [8, 256] at 8
    (kernels/notes/gate_residual.md has the figures and the command). Below H = 512 the [4, 512] steps are
    not measured. The interpreter runs programs and operations one after another at a fixed Python cost
    each: few, large tiles there."""
    block_c = min(256, next_power_of_2(hidden))
    if interpreted:
        rows = max(1, min(256, 16384 // block_c))
        return LaunchConfig(block_c=block_c, fwd_rows=rows, fwd_tiles=1, fwd_warps=4, bwd_rows=min(rows, 32),
                            bwd_warps=4, bwd_programs_per_sm=8, reduce_cols=min(4096, next_power_of_2(hidden)))
    rows = max(1, min(64, 4096 // block_c))
    common = dict(block_c=block_c, fwd_rows=rows, fwd_tiles=8, fwd_warps=4, bwd_warps=4, bwd_programs_per_sm=16)
    if hidden >= 512:  # 512-column backward steps of 4 rows (H200, H = 5376: backward kernel 408 us against 515)
        return LaunchConfig(**common, bwd_rows=4, bwd_block_c=512)
    return LaunchConfig(**common, bwd_rows=rows)


# --- forward -----------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["n_rows"])
def _fwd_kernel(RES, Y, GATE, IDX, OUT, n_rows, H: tl.constexpr, M, stride_res, stride_y, stride_g, stride_out,
                BLOCK_C: tl.constexpr, ROWS: tl.constexpr, TILES: tl.constexpr, BY_HAND: tl.constexpr):
    """Program (g, b): columns b*BLOCK_C .., rows of tiles g*TILES .. g*TILES + TILES - 1."""
    g = tl.program_id(0).to(tl.int64)  # int64 row arithmetic (the interpreter checks int32 overflow per op)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    for t in range(0, tl.minimum(TILES, tl.cdiv(n_rows - g * (TILES * ROWS), ROWS))):
        rows = (g * TILES + t) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        seg = segment(tl.load(IDX + rows, mask=row_ok, other=0), row_ok, M)
        m = tl.minimum(seg, M - 1).to(tl.int64)
        r = rows[:, None]
        mask = row_ok[:, None] & col_ok[None, :]
        gate = tl.load(GATE + m[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        res = tl.load(RES + r * stride_res + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + r * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        out = tl.where((seg < M)[:, None], res + gate * y, float("nan"))
        tl.store(OUT + r * stride_out + cols[None, :], rounded(out, OUT.dtype.element_ty, BY_HAND), mask=mask)


# --- backward ----------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["n_rows"])
def _bwd_kernel(DY, Y, GATE, IDX, ORDER, DRES, DYO, PART, n_rows, H: tl.constexpr, M, NB, CHUNK, stride_dy,
                stride_y, stride_g, stride_dres, stride_dyo, BLOCK_C: tl.constexpr, ROWS: tl.constexpr,
                CMAX: tl.constexpr, K_P2: tl.constexpr, BY_HAND: tl.constexpr):
    """Program (p, b): dres, dy_ and the gate partials of chunk p's rows, columns b*BLOCK_C .."""
    p = tl.program_id(0).to(tl.int64)  # int64 row arithmetic (the interpreter checks int32 overflow per op)
    b = tl.program_id(1)
    lo = p * CHUNK
    slot = p * NB + b  # this program's own scratch for its sorted list
    starts, counts = local_order(IDX, ORDER, slot, lo, tl.minimum(CHUNK, n_rows - lo), M, CMAX, K_P2)
    ks = tl.arange(0, K_P2)
    cols = b * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    slots = tl.arange(0, ROWS)
    # made once: the interpreter pays per tl.zeros / tl.sum call, so empty segments skip the sum (their
    # partial is +0.0 either way)
    zero = tl.zeros((ROWS, BLOCK_C), dtype=tl.float32)
    zero_row = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for k in range(0, M + 1):
        s0 = pick(starts, ks, k).to(tl.int64)
        s1 = s0 + pick(counts, ks, k)
        g = tl.load(GATE + tl.minimum(k, M - 1).to(tl.int64) * stride_g + cols, mask=col_ok, other=0.0)
        g = tl.where(k < M, g.to(tl.float32), float("nan"))  # bad-index rows: dy_ is NaN
        acc = zero
        for start in range(s0, s1, ROWS):
            pos = start + slots
            ok = pos < s1
            r = (lo + tl.load(ORDER + slot * CMAX + pos, mask=ok, other=0))[:, None]
            mask = ok[:, None] & col_ok[None, :]
            dy = tl.load(DY + r * stride_dy + cols[None, :], mask=mask, other=0.0)
            y = tl.load(Y + r * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if DRES.dtype.element_ty == DY.dtype.element_ty:  # static: the same bits, no conversion
                tl.store(DRES + r * stride_dres + cols[None, :], dy, mask=mask)
            else:  # res narrower than out: one rounding
                tl.store(DRES + r * stride_dres + cols[None, :],
                         rounded(dy.to(tl.float32), DRES.dtype.element_ty, BY_HAND), mask=mask)
            dyf = dy.to(tl.float32)
            tl.store(DYO + r * stride_dyo + cols[None, :], rounded(g[None, :] * dyf, DYO.dtype.element_ty, BY_HAND),
                     mask=mask)
            acc += dyf * y
        total = zero_row
        if s1 > s0:
            total = tl.sum(acc, axis=0)
        written = cols < tl.where(k < M, H, 0)  # the bad-index segment adds nothing
        tl.store(PART + (p * M + k) * H + cols, total, mask=written)


# --- launchers ---------------------------------------------------------------------------------------

def out_dtype(res: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.dtype:
    """torch's promotion of the three (what `res + gate[idx] * y` returns)."""
    if res.dtype == y.dtype == gate.dtype:
        return res.dtype
    return torch.promote_types(torch.promote_types(res.dtype, y.dtype), gate.dtype)


def forward(res: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, idx: torch.Tensor,
            config: Optional[LaunchConfig] = None) -> torch.Tensor:
    """res, y: [R, H] with unit inner stride; gate: [M, H] with unit inner stride; idx: [R]."""
    rows, hidden = res.shape
    out = torch.empty((rows, hidden), dtype=out_dtype(res, y, gate), device=res.device)
    if rows:
        cfg = config or launch_config(hidden)
        grid = (cdiv(rows, cfg.fwd_rows * cfg.fwd_tiles), cdiv(hidden, cfg.block_c))
        launch(_fwd_kernel, grid, res, y, gate, idx, out, rows, hidden, gate.shape[0], res.stride(0), y.stride(0),
               gate.stride(0), out.stride(0), BLOCK_C=cfg.block_c, ROWS=cfg.fwd_rows, TILES=cfg.fwd_tiles,
               BY_HAND=BY_HAND, num_warps=cfg.fwd_warps)
    return out


def backward_split(rows: int, hidden: int, cfg: LaunchConfig, device: torch.device) -> tuple[int, int]:
    """(chunks P, rows per chunk) of the backward: part of the gate gradient's order."""
    return split_row_chunks(rows, device, cfg.bwd_programs_per_sm, cdiv(hidden, cfg.bwd_columns),
                            cfg.chunk_limit)


def backward(dy: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, idx: torch.Tensor, need_gate: bool,
             config: Optional[LaunchConfig] = None, res_dtype: Optional[torch.dtype] = None
             ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """(dres, dy_, dgate or None), in res's (`res_dtype`, default dy's), y's and gate's dtypes. dy, y:
    [R, H] with unit inner stride."""
    rows, hidden = y.shape
    device = y.device
    table_rows = gate.shape[0]
    cfg = config or launch_config(hidden)
    dres = torch.empty((rows, hidden), dtype=res_dtype or dy.dtype, device=device)
    dyo = torch.empty((rows, hidden), dtype=y.dtype, device=device)
    if rows == 0:
        dgate = torch.zeros((table_rows, hidden), dtype=gate.dtype, device=device) if need_gate else None
        return dres, dyo, dgate
    if table_rows * hidden >= 2 ** 31:  # the partial-sum stage offsets a gate row by m * H in int32
        raise ValueError(f"a gate of {table_rows} rows of {hidden} is too large for this kernel's int32 offsets")
    programs, chunk = backward_split(rows, hidden, cfg, device)
    cmax = next_power_of_2(chunk)
    nb = cdiv(hidden, cfg.bwd_columns)
    order = torch.empty((programs * nb * cmax,), dtype=torch.int32, device=device)
    partials = torch.empty((programs, table_rows, hidden), dtype=torch.float32, device=device)
    launch(_bwd_kernel, (programs, nb), dy, y, gate, idx, order, dres, dyo, partials, rows, hidden, table_rows, nb,
           chunk, dy.stride(0), y.stride(0), gate.stride(0), dres.stride(0), dyo.stride(0), BLOCK_C=cfg.bwd_columns,
           ROWS=cfg.bwd_rows, CMAX=cmax, K_P2=next_power_of_2(table_rows + 2), BY_HAND=BY_HAND,
           num_warps=cfg.bwd_warps)
    if not need_gate:
        return dres, dyo, None
    dgate = torch.empty((table_rows, hidden), dtype=gate.dtype, device=device)
    launch(table_from_partials, (cdiv(hidden, cfg.reduce_cols), table_rows), partials, dgate, programs,
           hidden, table_rows, dgate.stride(0), BLOCK=cfg.reduce_cols, P_TILE=param_tile(programs, cfg.param_tile),
           BY_HAND=BY_HAND, num_warps=4)
    return dres, dyo, dgate
