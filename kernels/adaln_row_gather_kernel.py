"""adaln_row_gather in Triton: a one-launch gather-copy forward and a fixed-order, atomic-free backward.

    outs[c][r] = table[m_r, c*H : (c+1)*H],   m_r = ti[r] * MODS + tag[r],   c = 0 .. CHUNKS-1
    dtable[m, c*H + h] = sum over the rows r with m_r = m of douts[c][r, h]

Forward (`_fwd_kernel`, one launch): the six outputs are the six [S, H] slices of one [CHUNKS, S, H]
buffer (each contiguous). Grid (row group, chunk x column block): a program owns BLOCK_C columns of one
chunk and copies them for FWD_TILES tiles of FWD_ROWS consecutive rows; its table working set is
M x BLOCK_C elements (4.6 KB at BLOCK_C = 256 in bf16), so the table rows it gathers stay in L1 and the
traffic that remains is the output write (+16 index bytes per row). A copy: every output is bitwise the
table element, whatever the batch, the grid or the row's position. A row whose ti or tag is out of
range comes out NaN; with a gradient, the combined index m (int32, -1 for a bad row) is stored for the
backward by the programs of column block 0.

Backward, three launches, no atomics, a summation order fixed by (indices, S, H, the GPU's SM count):

1. `_order_kernel`: the rows are split into P chunks of CHUNK rows (`kernels.common.split_row_chunks`:
   a function of S, the column split and the SM count only); each chunk is cut into sub-chunks of at
   most SORT rows, and each sub-chunk is sorted by table row by a stable counting sort
   (`kernels.common.local_order`), giving per sub-chunk its row list grouped by table row, ascending
   within each group, and where each group starts.
2. `_partials_kernel`, grid (P, CHUNKS x NB): program (p, c, b) owns BLOCK_C columns of gradient c and
   chunk p. For each table row m = 0 .. M-1 in turn it walks chunk p's rows of m: sub-chunk by
   sub-chunk, in ascending row order, BWD_ROWS sorted rows per step, row slot i of a
   [BWD_ROWS, BLOCK_C] fp32 accumulator adding the rows at sorted positions start + i. At the end of m
   the slots are added by one fixed tl.sum tree and written as partial row [p, m] (zeros when the chunk
   has no row of m). Bad-index rows (m = -1) form their own segment and are never read.
3. `kernels.common.table_from_partials`: per column, the partials of chunks 0, 1, ..., P-1 in tiles
   of PARAM_TILE (a fixed tl.sum tree per tile, tiles left to right: `kernels.common.sum_partials`),
   rounded once to the table's dtype.

fp32 accumulation throughout; each table-gradient element is rounded once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from h3bench.kernels.common import (BY_HAND, INTERPRETED, cdiv, launch, local_order, param_tile, split_row_chunks,
                            next_power_of_2, table_from_partials)

MAX_CHUNKS = 6  # the backward takes the output gradients as separate pointer arguments


@dataclass(frozen=True)
class LaunchConfig:
    """How the kernels are launched for one H (`config_for`; tests pass smaller chunks and sorts). The
    backward's fields are part of the table gradient's summation order (a function of H and the device
    only)."""

    block_c: int                 # columns per program, forward and backward (per chunk: cdiv(H, block_c) blocks)
    fwd_rows: int                # forward: rows per tile
    fwd_tiles: int               # forward: tiles per program
    fwd_warps: int
    bwd_rows: int                # backward: sorted rows per step (accumulator slots)
    bwd_warps: int
    bwd_programs_per_sm: int     # backward: walk programs per SM in all (sets the row chunks)
    chunk_limit: int = 16384     # backward: rows per chunk at most
    sort_rows: int = 1024        # backward: rows per counting sort (its one-hot is [sort_rows, M + 2])
    reduce_cols: int = 64        # table-gradient stage: columns per program
    param_tile: int = 256        # table-gradient stage: partial rows per tl.sum, at most


@functools.lru_cache(maxsize=64)
def launch_config(hidden: int) -> LaunchConfig:
    """The default launch configuration for chunks of `hidden` columns (`config_for`)."""
    return config_for(hidden, INTERPRETED)


def config_for(hidden: int, interpreted: bool) -> LaunchConfig:
    """On a GPU: [16, 256] forward tiles (4 warps: 32 bf16 per thread, four 16-byte accesses), eight
    tiles per program; [16, 256] backward steps (8 KB per load: with ~7 programs resident per SM, ~56 KB
    in flight, above the ~32-42 KB 4.25 TB/s needs at ~1-1.3 us per dependent index + tile load), 16
    walk programs per SM. Timed on the H200 at S = 32768, H = 5376 only (kernels/notes/adaln_row_gather.md
    has the figures, 92% of the forward floor, and the command); no other shape has been timed on a GPU.
    The interpreter runs programs and operations one after another at a fixed Python cost each: few, large
    tiles there."""
    block_c = min(256, next_power_of_2(hidden))
    if interpreted:
        rows = max(1, min(256, 16384 // block_c))
        return LaunchConfig(block_c=block_c, fwd_rows=rows, fwd_tiles=1, fwd_warps=4, bwd_rows=min(rows, 32),
                            bwd_warps=4, bwd_programs_per_sm=16,
                            reduce_cols=min(4096, next_power_of_2(6 * hidden)))
    return LaunchConfig(block_c=block_c, fwd_rows=max(1, min(64, 4096 // block_c)), fwd_tiles=8, fwd_warps=4,
                        bwd_rows=max(1, min(64, 4096 // block_c)), bwd_warps=4, bwd_programs_per_sm=16)


# --- forward -----------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["n_rows"])
def _fwd_kernel(TABLE, TI, TAG, OUT, IDX, n_rows, H: tl.constexpr, NB, STEPS, MODS, stride_t,
                BLOCK_C: tl.constexpr, ROWS: tl.constexpr, TILES: tl.constexpr, SAVE_IDX: tl.constexpr):
    """Program (g, c * NB + b): columns b*BLOCK_C.. of chunk c, rows of tiles g*TILES .. g*TILES+TILES-1."""
    g = tl.program_id(0).to(tl.int64)  # int64 row arithmetic (the interpreter checks int32 overflow per op)
    j = tl.program_id(1)
    c = j // NB
    cols = (j - c * NB) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    src = TABLE + c * H + cols
    dst = OUT + c.to(tl.int64) * n_rows * H + cols
    for t in range(0, tl.minimum(TILES, tl.cdiv(n_rows - g * (TILES * ROWS), ROWS))):
        rows = (g * TILES + t) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        ti = tl.load(TI + rows, mask=row_ok, other=0).to(tl.int64)
        tag = tl.load(TAG + rows, mask=row_ok, other=0).to(tl.int64)
        good = (ti >= 0) & (ti < STEPS) & (tag >= 0) & (tag < MODS)
        m = tl.where(good, ti * MODS + tag, 0)
        if SAVE_IDX:
            # (a row limit, not `row_ok & (j == 0)`: the interpreter rejects scalar terms in masks)
            tl.store(IDX + rows, tl.where(good, m, -1).to(tl.int32), mask=rows < tl.where(j == 0, n_rows, 0))
        mask = row_ok[:, None] & col_ok[None, :]
        v = tl.load(src[None, :] + m[:, None] * stride_t, mask=mask, other=0.0)
        v = tl.where(good[:, None], v, float("nan"))
        tl.store(dst[None, :] + rows[:, None] * H, v, mask=mask)


# --- backward ----------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["n_rows"])
def _order_kernel(IDX, ORDER, STARTS, n_rows, M, CHUNK, SUBS, SORT: tl.constexpr, K_P2: tl.constexpr):
    """Program (p, s): sub-chunk s of chunk p sorted by table row. ORDER[(p*SUBS + s)*SORT + i] holds the
    row offsets from the sub-chunk's first row; STARTS[(p*SUBS + s)*2*K_P2 + k] where segment k starts
    in that list, and + K_P2 its length."""
    p = tl.program_id(0)
    s = tl.program_id(1)
    q = p * SUBS + s
    lo = p * CHUNK + s * SORT
    n = tl.minimum(SORT, tl.minimum(p * CHUNK + CHUNK, n_rows) - lo)
    starts, counts = local_order(IDX, ORDER, q, lo, n, M, SORT, K_P2)
    ks = tl.arange(0, K_P2)
    tl.store(STARTS + q * (2 * K_P2) + ks, starts)
    tl.store(STARTS + q * (2 * K_P2) + K_P2 + ks, counts)


@triton.jit
def _walk(G, stride_g, c, ORDER, STARTS, PART, p, cols, col_ok, H: tl.constexpr, M, CHUNK, SUBS,
          W_ALL: tl.constexpr, SORT: tl.constexpr, K_P2: tl.constexpr, BLOCK_C: tl.constexpr,
          ROWS: tl.constexpr):
    """Chunk p's rows of gradient G, table row by table row (module docstring, step 2)."""
    slots = tl.arange(0, ROWS)
    # Made once, outside the loops: the interpreter pays per operation (and per tl.zeros / tl.sum call),
    # so empty segments also skip the sum (their partial is +0.0 either way).
    zero = tl.zeros((ROWS, BLOCK_C), dtype=tl.float32)
    zero_row = tl.zeros((BLOCK_C,), dtype=tl.float32)
    lists = STARTS + p * (SUBS * 2 * K_P2)       # sub-chunk s's starts at lists + s*2*K_P2, counts + K_P2
    order = ORDER + p * (SUBS * SORT) + slots    # sub-chunk s's sorted list at order + s*SORT
    part = PART + p * (M * W_ALL) + c * H + cols  # partial row [p, m] at part + m*W_ALL
    first = p * CHUNK                            # sub-chunk s's first row: first + s*SORT
    for m in range(0, M):
        acc = zero
        seen = p * 0  # rows of m in this chunk
        for s in range(0, SUBS):
            at = lists + s * (2 * K_P2) + m
            s0 = tl.load(at).to(tl.int64)
            s1 = s0 + tl.load(at + K_P2)
            seen += s1 - s0
            for start in range(s0, s1, ROWS):
                ok = start + slots < s1
                r = first + s * SORT + tl.load(order + s * SORT + start, mask=ok, other=0)
                tile = tl.load(G + r[:, None] * stride_g + cols[None, :],
                               mask=ok[:, None] & col_ok[None, :], other=0.0)
                acc += tile.to(tl.float32)
        total = zero_row
        if seen > 0:
            total = tl.sum(acc, axis=0)
        tl.store(part + m * W_ALL, total, mask=col_ok)


@triton.jit(do_not_specialize=["n_rows"])
def _partials_kernel(G0, G1, G2, G3, G4, G5, sg0, sg1, sg2, sg3, sg4, sg5, ORDER, STARTS, PART, n_rows,
                     H: tl.constexpr, M, NB, CHUNK, SUBS, W_ALL: tl.constexpr, SORT: tl.constexpr,
                     K_P2: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr):
    """Program (p, c * NB + b): partial rows [p, m] of gradient c's columns b*BLOCK_C .., every m."""
    p = tl.program_id(0).to(tl.int64)  # int64 row arithmetic (the interpreter checks int32 overflow per op)
    j = tl.program_id(1)
    c = j // NB
    cols = (j - c * NB) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    # The gradients are separate tensors: one branch per chunk, each a copy of the same walk.
    if c == 0:
        _walk(G0, sg0, 0, ORDER, STARTS, PART, p, cols, col_ok, H, M, CHUNK, SUBS, W_ALL, SORT, K_P2, BLOCK_C, ROWS)
    elif c == 1:
        _walk(G1, sg1, 1, ORDER, STARTS, PART, p, cols, col_ok, H, M, CHUNK, SUBS, W_ALL, SORT, K_P2, BLOCK_C, ROWS)
    elif c == 2:
        _walk(G2, sg2, 2, ORDER, STARTS, PART, p, cols, col_ok, H, M, CHUNK, SUBS, W_ALL, SORT, K_P2, BLOCK_C, ROWS)
    elif c == 3:
        _walk(G3, sg3, 3, ORDER, STARTS, PART, p, cols, col_ok, H, M, CHUNK, SUBS, W_ALL, SORT, K_P2, BLOCK_C, ROWS)
    elif c == 4:
        _walk(G4, sg4, 4, ORDER, STARTS, PART, p, cols, col_ok, H, M, CHUNK, SUBS, W_ALL, SORT, K_P2, BLOCK_C, ROWS)
    else:
        _walk(G5, sg5, 5, ORDER, STARTS, PART, p, cols, col_ok, H, M, CHUNK, SUBS, W_ALL, SORT, K_P2, BLOCK_C, ROWS)


# --- launchers ---------------------------------------------------------------------------------------

def forward(table: torch.Tensor, ti: torch.Tensor, tag: torch.Tensor, modalities: int, chunks: int,
            save_index: bool, config: Optional[LaunchConfig] = None
            ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(the [chunks, S, H] buffer, whose slices along dim 0 are the outputs, the combined int32 index or
    None). `table` has a unit inner stride."""
    rows = ti.shape[0]
    hidden = table.shape[1] // chunks
    buf = torch.empty((chunks, rows, hidden), dtype=table.dtype, device=table.device)
    idx = torch.empty((rows,), dtype=torch.int32, device=table.device) if save_index else None
    if rows:
        cfg = config or launch_config(hidden)
        nb = cdiv(hidden, cfg.block_c)
        grid = (cdiv(rows, cfg.fwd_rows * cfg.fwd_tiles), chunks * nb)
        launch(_fwd_kernel, grid, table, ti, tag, buf, idx if save_index else buf, rows, hidden, nb,
               table.shape[0] // modalities, modalities, table.stride(0), BLOCK_C=cfg.block_c, ROWS=cfg.fwd_rows,
               TILES=cfg.fwd_tiles, SAVE_IDX=save_index, num_warps=cfg.fwd_warps)
    return buf, idx


def backward_split(rows: int, hidden: int, chunks: int, cfg: LaunchConfig, device: torch.device
                   ) -> tuple[int, int, int, int]:
    """(chunks P, rows per chunk, rows per sort, sorts per chunk) of the backward: part of the order."""
    column_programs = chunks * cdiv(hidden, cfg.block_c)
    programs, chunk = split_row_chunks(rows, device, cfg.bwd_programs_per_sm, column_programs, cfg.chunk_limit)
    sort = min(next_power_of_2(cfg.sort_rows), next_power_of_2(chunk))
    return programs, chunk, sort, cdiv(chunk, sort)


def backward(grads: Sequence[torch.Tensor], idx: torch.Tensor, table_rows: int, hidden: int,
             dtype: torch.dtype, config: Optional[LaunchConfig] = None) -> torch.Tensor:
    """The table gradient [table_rows, len(grads) * hidden] from the outputs' gradients (each [S, hidden],
    unit inner stride) and the forward's combined index."""
    chunks = len(grads)
    rows = idx.shape[0]
    device = idx.device
    width = chunks * hidden
    if rows == 0:
        return torch.zeros((table_rows, width), dtype=dtype, device=device)
    if not 1 <= chunks <= MAX_CHUNKS:
        raise ValueError(f"this kernel takes 1 to {MAX_CHUNKS} output gradients, got {chunks}")
    cfg = config or launch_config(hidden)
    programs, chunk, sort, subs = backward_split(rows, hidden, chunks, cfg, device)
    if table_rows * width >= 2 ** 31:  # the partial-sum stage offsets a table row by m * width in int32
        raise ValueError(f"a table of {table_rows} rows of {width} is too large for this kernel's int32 offsets")
    k_p2 = next_power_of_2(table_rows + 2)
    order = torch.empty((programs * subs * sort,), dtype=torch.int32, device=device)
    starts = torch.empty((programs * subs * 2 * k_p2,), dtype=torch.int32, device=device)
    partials = torch.empty((programs, table_rows, width), dtype=torch.float32, device=device)
    out = torch.empty((table_rows, width), dtype=dtype, device=device)
    launch(_order_kernel, (programs, subs), idx, order, starts, rows, table_rows, chunk, subs, SORT=sort, K_P2=k_p2,
           num_warps=8 if sort >= 1024 else 4)  # the one-hot is [SORT, K_P2]: 64 int32 per thread at most
    padded = list(grads) + [grads[0]] * (MAX_CHUNKS - chunks)
    nb = cdiv(hidden, cfg.block_c)
    launch(_partials_kernel, (programs, chunks * nb), *padded, *[g.stride(0) for g in padded], order, starts,
           partials, rows, hidden, table_rows, nb, chunk, subs, W_ALL=width, SORT=sort, K_P2=k_p2,
           BLOCK_C=cfg.block_c, ROWS=cfg.bwd_rows, num_warps=cfg.bwd_warps)
    launch(table_from_partials, (cdiv(width, cfg.reduce_cols), table_rows), partials, out, programs, width,
           table_rows, out.stride(0), BLOCK=cfg.reduce_cols, P_TILE=param_tile(programs, cfg.param_tile),
           BY_HAND=BY_HAND, num_warps=4)
    return out
