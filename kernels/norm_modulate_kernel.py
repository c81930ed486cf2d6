"""norm_modulate in Triton: batch-invariant, deterministic, fp32 inside, one rounding per output.

    y = xhat * a[m] + sh[m],   xhat = x * rstd,  rstd = 1 / sqrt(sum(x^2) / H + eps),  a[m] = w * (1 + sc[m])
    dx = (g - xhat * c) * rstd,   g = dy * a[m],  c = sum(g * xhat) / H
    dsh[m] = D[m],  dsc[m] = w * S[m],  dw = sum over m of (1 + sc[m]) * S[m]
    where D[m] = sum of dy and S[m] = sum of dy * xhat over the rows r with idx[r] = m.

Dtypes: x, w, sh and sc are each bf16, fp16 or fp32, independently. All arithmetic is fp32; y and dx come
out in x's dtype, dw in w's, dsh in sh's, dsc in sc's; every output is rounded once, to nearest even, at
its store. A row whose index is outside [0, M) comes out NaN (y and dx) and adds nothing to any gradient.

The design, its floors and the measurements behind every launch setting: kernels/notes/norm_modulate.md.

Kernels (all launch settings in `LaunchConfig`, a function of H only: `launch_config`)
* forward, one place (`_normalize_modulate` does the arithmetic), two ways to walk the rows:
  `_fwd_rows_kernel` gathers w, sh[m], sc[m] for every row, ROWS rows per program in row order (above
  H = 4096 x is read again for y instead of held in registers across the table loads); `_fwd_walk_kernel`
  (above H = 4096 under the global plan, `plan_walk_rows`) walks a program's slice of the plan, loading
  a[m] = w * (1 + sc[m]) and sh[m] once per segment, with the next ROWS rows prefetched: the tables are
  read once per segment instead of once per row.
* backward, one place (`_row_grads` does the arithmetic): `_bwd_kernel` keeps whole rows and the fp32
  sums in registers (ROWS rows per step, the next step prefetched), up to H = 8192. Above (a whole row
  no longer fits in registers) the split backward: `_bwd_dots_kernel` makes every row's c first, then
  `_bwd_kernel` runs once per column block of bwd_cols with c given (each (program, block) walks the
  program's rows for its columns only). Then `_bwd_params_kernel` (local plan) or `_bwd_combine_kernel`
  (global plan) makes dw, dsh, dsc.

Plans: how a program gets its rows sorted by table row ("segment" = the rows of one table row).
* local plan (M <= LaunchConfig.local_max; the model's M = 9): the rows are split into fixed chunks
  (`backward_split`), one per program; a program sorts its own chunk with a stable counting sort in
  registers (`local_order`; bad indices form segment M) and walks segments 0..M in turn. It writes a
  partial row for every (program, table row): partial memory [programs, 2M + 1, H] fp32.
* global plan (M > local_max): the rows are sorted once, stably, by idx (`make_plan`, kernels/plan.py:
  a counting sort, so rows of one table row keep ascending row order); program p takes positions
  [p*CHUNK, (p+1)*CHUNK) of that list, and its segments are the runs of equal keys in that slice. A
  segment wholly inside one program is written straight to dsh/dsc; only a program's first segment
  (if it began in an earlier program) and last segment (if it goes on into a later one) go to
  partial slots: partial memory [programs, 5, H] fp32 whatever M is (+ [2, programs] int32 keys).
  Table rows no row uses get zeros, written by the program whose slice their place in the order falls in.

Partial memory (fp32 bytes): local 4*P*(2M + 1)*H with M <= local_max; global 20*P*H; the split backward
adds c, 4*R bytes. P = programs of the backward (`backward_split`: about SMs x bwd_programs_per_sm, at
least ceil(R / chunk_limit)).

Reduction orders (the point of this kernel: change them only with the probes rerun):

* Per row, forward and dx. Each sum over H is made per row of a [ROWS, width] tile by tl.sum over
  axis 1: each thread adds its own contiguous elements, lanes combine by butterfly shuffles, warps
  through shared memory. `_fwd_rows_kernel` sums the squares over a HEAD-wide block (the largest power
  of two <= H) plus a TAIL-wide block (the rest), in that order; `_fwd_walk_kernel` and `_bwd_kernel`
  over one BLOCK_H-wide block; `_bwd_dots_kernel` sums c over column chunks of dots_chunk, chunk 0
  first, left to right ([dots_rows, dots_chunk] tiles on dots_warps warps). Tile shapes, chunk widths
  and warp counts are functions of H (LaunchConfig), every row of a tile has the same layout, and
  masked-off rows are zeros in rows of their own: nothing in a row's tree depends on R, the grid, the
  plan or the row's position, so a row's y and dx are bitwise the same alone or in any batch (for a
  given LaunchConfig; different configs are different trees). Which forward kernel runs depends on H and
  on M > local_max (the plan walk above H = 4096), never on R or the grad mode: at one (H, M) training
  and inference give the same y bits.
* Parameter gradients: cross-row sums in a fixed order, without atomics. Within a program, for each
  of its segments in turn (its rows in ascending row order, both plans): per column, D and S add one
  step's tl.sum over its ROWS rows (axis 0) at a time, steps in list order. Local plan:
  partial [p, m] for every program p and table row m (zeros when p has no row of m); dsh[m] and dsc[m]
  add, per column, the partials of programs 0, 1, ... in tiles of P_TILE (one tl.sum tree per tile,
  tiles left to right; `sum_partials`). Global plan: a segment inside one program is final; a segment
  cut by program boundaries is its first program's partial plus the sum (tiles of P_TILE, left to
  right) of the following programs' partials. dw: each program keeps sum over its segments, in order,
  of (1 + sc[m]) * S_p[m]; dw adds the programs' sums in tiles of P_TILE. These orders depend on (idx,
  R, H, the device's SM count) only, so the gradients repeat bitwise run to run.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from h3bench.kernels.common import (BY_HAND, INTERPRETED, cdiv, launch_keyed, local_order, param_tile, pick, rounded,
                                    segment, next_power_of_2, split_rows, sum_partials, tensor_key)
# the global plan (rows sorted stably by table row), called as K.make_plan by the API too
from h3bench.kernels.plan import make_plan

MAX_HIDDEN = 32768
# The split backward's first pass (`_bwd_dots_kernel`): [DOTS_ROWS, DOTS_CHUNK] tiles on DOTS_WARPS warps;
# part of c's order (chunks of DOTS_CHUNK, chunk 0 first).
DOTS_ROWS, DOTS_CHUNK, DOTS_WARPS = 2, 2048, 4
LOCAL_MAX = 16                     # default local_max: the local plan's one-hot sort is [CMAX, M + 2] wide


@dataclass(frozen=True, eq=False)  # hashed by identity: a cheap key for the launch recipes
class LaunchConfig:
    """How the kernels are launched for one H. Part of the reduction order (tile shapes, warps, the
    backward's split), so a function of H only; tests and tools/sweep_norm_modulate.py's presets replace
    fields of `launch_config(H)` to run the same kernels at other shapes."""

    block_h: int                   # next power of two >= H (the backward's row vector; row_gather's too)
    fwd_rows: int                  # `_fwd_rows_kernel`: rows per program
    fwd_warps: int
    bwd_rows: int                  # `_bwd_kernel`: rows per step
    bwd_warps: int
    bwd_programs_per_sm: int
    # > 0: the split backward (every row's c first, then column blocks of this width, bwd_rows rows a step;
    # the default above SPLIT_ABOVE); 0: whole rows in registers
    bwd_cols: int = 0
    # `_fwd_rows_kernel`: x read past L1 (.cg) and y stored evict_first, the tables kept in L1 (the default
    # up to 4096 lanes a row), or x read again for y instead of held across the table loads (above)
    fwd_l1_tables: bool = False
    fwd_reload: bool = False
    # > 0: under the global plan (M > local_max, training and inference alike) the forward is
    # `_fwd_walk_kernel`, plan_walk_rows rows a step on plan_walk_warps warps, plan_walk_programs_per_sm
    # programs an SM (the default above 4096 lanes a row); 0: `_fwd_rows_kernel` under the plan too
    plan_walk_rows: int = 0
    plan_walk_warps: int = 8
    plan_walk_programs_per_sm: int = 2
    local_max: int = LOCAL_MAX     # M <= local_max: local plan; above: global plan
    chunk_limit: int = 1024        # rows per program at most (the local sort is a [CMAX, M + 2] one-hot)
    param_cols: int = 32           # parameter stage: columns per program (each width its own fixed tl.sum trees)
    param_tile: int = 256          # parameter stage: partial rows per tl.sum, at most
    # the split backward's first pass (`_bwd_dots_kernel`): [dots_rows, dots_chunk] tiles on dots_warps warps
    # (part of c's order: chunks of dots_chunk, chunk 0 first), each chunk's x and dy loaded one chunk ahead
    dots_rows: int = DOTS_ROWS
    dots_chunk: int = DOTS_CHUNK
    dots_warps: int = DOTS_WARPS
    # `_bwd_kernel` compiled with FMA contraction on: dx then depends on which gradients are requested
    # (`_bwd_recipe`), so never the default; a preset of tools/sweep_norm_modulate.py for timing what
    # turning it off costs (kernels/notes/norm_modulate.md, "dx whatever gradients are requested")
    bwd_fp_fusion: bool = False

    def __post_init__(self):
        for name in ("fwd_rows", "bwd_rows", "bwd_cols", "block_h", "plan_walk_rows", "dots_rows", "dots_chunk"):
            value = getattr(self, name)
            if value and value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")


# Interpreter: one parameter program per 1024 columns (each interpreted program costs milliseconds).
_PARAM_COLS = 1024 if INTERPRETED else 32
# H above this takes the split backward (kernels/notes/norm_modulate.md, "Launch configuration by width"):
# at H = 8192 the whole-row backward spills ~120 B a thread at sm_90 and is still the faster one on the H200;
# at 16384 lanes a row it would spill several times that.
SPLIT_ABOVE = 8192


@functools.lru_cache(maxsize=64)
def launch_config(hidden: int) -> LaunchConfig:
    """The default launch configuration for rows of `hidden` elements. Each choice and the H200 kernel
    times that made it: kernels/notes/norm_modulate.md, "Launch configuration by width"; registers per
    thread (sm_90, `python -m tools.compile_norm_modulate`) set the shapes, each kernel with 16-32 KB of
    loads in flight per SM. The comments below say why each choice; the note has the kernel times per
    fwd+bwd step at R = 32768 and the command for each (`python -m tools.kernel_times --hidden H --table-rows
    M --variants default,PRESET`, the presets of tools/sweep_norm_modulate.py naming each alternative)."""
    block_h = next_power_of_2(hidden)
    common = dict(block_h=block_h, bwd_programs_per_sm=1, param_cols=_PARAM_COLS)
    if block_h <= 4096:
        # the per-row forward with the tables kept in L1, under the global plan too: the plan walk measured
        # slower here (`plan-walk`)
        rows, warps = row_tile(block_h)
        fwd = dict(fwd_rows=rows, fwd_warps=warps, fwd_l1_tables=True)
    else:
        # x read again for y (`fwd-no-reload`: faster from 5376 lanes, the same bits), and the plan walk
        # under the global plan (`fwd-plan-rows`: faster at M = 1024 and 4096, even at M = 64)
        fwd = dict(fwd_rows=1, fwd_warps=4 if block_h <= 8192 else 8,  # 16 warps spill at 32768
                   fwd_reload=True, plan_walk_rows=1, plan_walk_warps=8)
    if hidden > SPLIT_ABOVE:
        # [2, 4096] steps on 8 warps: a few % less kernel time than [4, 2048] (`bwd-split-r4c2048`) at
        # H = 12288 (72 B spilled at sm_90 under the global plan, triton 3.6)
        bwd = dict(bwd_rows=2, bwd_warps=8, bwd_cols=4096)
    else:
        rows, warps = whole_row_tile(block_h)
        if block_h <= 4096:
            # two programs an SM, each half the tile on half the warps (`bwd-1sm`: faster at every width up
            # to 4096, most at 1024; the partials double: 20 MB at H = 1024, M = 9)
            bwd = dict(bwd_rows=max(1, rows // 2), bwd_warps=max(1, warps // 2), bwd_programs_per_sm=2)
            if block_h <= 2048 and not INTERPRETED:
                # twice the partial rows of one program an SM: 16 columns a parameter program (`param-c8` /
                # `-c16` / `-c64`: the fastest up to 2048 lanes; at 3072 and 5376 16 columns were slower, 8
                # slower than 16 at every width)
                bwd["param_cols"] = 16
        else:
            bwd = dict(bwd_rows=rows, bwd_warps=warps)
    return LaunchConfig(**{**common, **fwd, **bwd})


def row_tile(block_h: int) -> tuple[int, int]:
    """(rows, warps) of the per-row forward tile: 4K elements a program below 2048 lanes a row, one
    row and 4 warps from there."""
    if block_h < 2048:
        rows = max(1, 4096 // block_h)
        return rows, _warps(rows * block_h)
    return 1, 4


def whole_row_tile(block_h: int) -> tuple[int, int]:
    """(rows a step, warps) of the whole-row backward as one program an SM: 8K elements a step up to 1024
    lanes a row, 4K above (halved, on half the warps, where two programs share an SM)."""
    rows = max(1, min(64, 8192 // block_h)) if block_h <= 1024 else max(1, 4096 // block_h)
    return rows, _warps(rows * block_h)


def _warps(tile_elements: int) -> int:
    """8 warps for tiles of 4K elements and up, fewer for small tiles (tiny H)."""
    return max(1, min(8, tile_elements // 512))




# --- walking a program's rows in segment order (both plans) -------------------------------------------

@triton.jit
def _walk_begin(IDX, KEYS, SCRATCH, n_rows, M, CHUNK, CMAX: tl.constexpr, K_P2: tl.constexpr, GLOBAL: tl.constexpr):
    """This program's slice lo .. lo + n - 1 of the rows and its segments (module docstring, Plans), and
    the table row just before the slice (global plan; -1 if none).
    Local: SCRATCH[pid*CMAX + j] = the j-th row's offset from lo after the local sort; segment s is
    table row s (M: bad indices), bounds from `starts`/`counts`. Global: the slice is positions of the
    sorted list; SCRATCH[pid*2*(CMAX+2) + s] = where run s starts (n after the last run, twice), and
    CMAX + 2 further on its key clamped to [-1, M] (-1 and M: bad indices), so a segment's bounds and key
    are independent loads."""
    pid = tl.program_id(0)
    lo = pid * CHUNK
    n = tl.minimum(CHUNK, n_rows - lo)
    if GLOBAL:
        i = tl.arange(0, CMAX)
        ok = i < n
        key = tl.load(KEYS + lo + i, mask=ok, other=0)
        prev = tl.load(KEYS + lo + i - 1, mask=ok & (lo + i > 0), other=-1)
        first = (ok & ((i == 0) | (key != prev))).to(tl.int32)
        n_seg = tl.sum(first, axis=0)
        base = pid * 2 * (CMAX + 2)
        run = tl.cumsum(first, axis=0) - 1
        tl.store(SCRATCH + base + run, i, mask=first != 0)
        tl.store(SCRATCH + base + CMAX + 2 + run, _clamped(key, M), mask=first != 0)
        tl.store(SCRATCH + base + n_seg + tl.arange(0, 2), n + tl.zeros([2], dtype=tl.int32))
        before_key = tl.max(tl.where(i == 0, _clamped(prev, M), -2), axis=0)  # prev at i = 0: KEYS[lo - 1]
        tl.debug_barrier()  # the walk reads the runs back, each thread other threads' writes
        starts = tl.zeros([K_P2], dtype=tl.int32)
        counts = starts
    else:
        starts, counts = local_order(IDX, SCRATCH, pid, lo, n, M, CMAX, K_P2)
        n_seg = M + 1
        before_key = n * 0 - 1
    return pid, lo, n, n_seg, starts, counts, before_key


@triton.jit
def _clamped(key, M):
    """A table row as int32, bad indices (< 0, >= M) clamped to -1 and M."""
    return tl.minimum(tl.maximum(key, -1), M).to(tl.int32)


@triton.jit
def _segment(s, lo, n, starts, counts, KEYS, SCRATCH, pid, CMAX: tl.constexpr, K_P2: tl.constexpr,
             GLOBAL: tl.constexpr):
    """Segment s: (its table row as in idx, [s0, s1) in the program's list, end of the next non-empty
    segment's slice: where a prefetch across the segment's end stops)."""
    ks = tl.arange(0, K_P2)
    if GLOBAL:
        base = SCRATCH + pid * 2 * (CMAX + 2)
        s0 = tl.load(base + s)
        s1 = tl.load(base + s + 1)
        after = tl.load(base + s + 2)  # the sentinel n follows the last run twice
        key = tl.load(base + CMAX + 2 + s)
    else:
        s0 = pick(starts, ks, s)
        s1 = s0 + pick(counts, ks, s)
        following = tl.min(tl.where((ks > s) & (counts > 0), ks, K_P2), axis=0)
        after = tl.where(following < K_P2, pick(starts + counts, ks, following), n)
        key = s
    return key, s0, s1, after


@triton.jit
def _first_slice_end(lo, n, starts, counts, SCRATCH, pid, CMAX: tl.constexpr, K_P2: tl.constexpr,
                     GLOBAL: tl.constexpr):
    """End of the first non-empty segment's slice (where the first prefetch stops)."""
    ks = tl.arange(0, K_P2)
    if GLOBAL:
        end = tl.load(SCRATCH + pid * 2 * (CMAX + 2) + 1)
    else:
        following = tl.min(tl.where(counts > 0, ks, K_P2), axis=0)
        end = tl.where(following < K_P2, pick(starts + counts, ks, following), n)
    return end


@triton.jit
def _rows_at(pos, ok, lo, ORDER, SCRATCH, pid, CMAX: tl.constexpr, GLOBAL: tl.constexpr):
    """Rows (int64) at positions `pos` of the program's list."""
    if GLOBAL:
        rows = tl.load(ORDER + lo + pos, mask=ok, other=0).to(tl.int64)
    else:
        rows = lo + tl.load(SCRATCH + pid * CMAX + pos, mask=ok, other=0).to(tl.int64)
    return rows


@triton.jit
def _next_step(start, s1, after, ROWS: tl.constexpr):
    """The step after [start, start + ROWS) of a segment ending at s1: more of it, or the next slice."""
    more = start + ROWS < s1
    return tl.where(more, start + ROWS, s1), tl.where(more, s1, after)


@triton.jit
def _load_tile(P, rows, stride, cols, ok, H: tl.constexpr, STREAM: tl.constexpr):
    mask = ok[:, None] & (cols < H)[None, :]
    ptrs = P + rows[:, None] * stride + cols[None, :]
    if STREAM:
        # .cg alone: ptxas (triton 3.6, sm_90a) refuses .cg combined with an evict_first policy
        tile = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    else:
        tile = tl.load(ptrs, mask=mask, other=0.0)
    return tile


@triton.jit
def _scale(W, SC, key, M, cols, col_ok, stride_sc):
    """a = w * (1 + sc[key]) in fp32; NaN for a bad index, so its rows come out NaN."""
    valid = (key >= 0) & (key < M)
    m = tl.minimum(tl.maximum(key, 0), M - 1).to(tl.int64)
    a = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) * \
        (1.0 + tl.load(SC + m * stride_sc + cols, mask=col_ok, other=0.0).to(tl.float32))
    return tl.where(valid, a, float("nan"))


# --- forward -------------------------------------------------------------------------------------------

@triton.jit
def _normalize_modulate(Y, rows, ok, cols, x, rstd, a, sh, H: tl.constexpr, STREAM: tl.constexpr,
                        BY_HAND: tl.constexpr):
    """y = (x * rstd) * a + sh for a [ROWS, width] tile, rounded once to Y's dtype and stored."""
    y = (x * rstd[:, None]) * a + sh
    ptrs = Y + rows[:, None] * H + cols[None, :]
    mask = ok[:, None] & (cols < H)[None, :]
    if STREAM:
        tl.store(ptrs, rounded(y, Y.dtype.element_ty, BY_HAND), mask=mask, eviction_policy="evict_first")
    else:
        tl.store(ptrs, rounded(y, Y.dtype.element_ty, BY_HAND), mask=mask)


@triton.jit
def _tables(W, SH, SC, ok, m, cols, H: tl.constexpr, stride_sh, stride_sc, L1_TABLES: tl.constexpr):
    """w, sc[m], sh[m] for a [ROWS, width] tile, as stored (kept in L1 when L1_TABLES)."""
    col_ok = cols < H
    mask = ok[:, None] & col_ok[None, :]
    if L1_TABLES:
        w = tl.load(W + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
        sc = tl.load(SC + m[:, None] * stride_sc + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last")
        sh = tl.load(SH + m[:, None] * stride_sh + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last")
    else:
        w = tl.load(W + cols, mask=col_ok, other=0.0)
        sc = tl.load(SC + m[:, None] * stride_sc + cols[None, :], mask=mask, other=0.0)
        sh = tl.load(SH + m[:, None] * stride_sh + cols[None, :], mask=mask, other=0.0)
    return w, sc, sh


@triton.jit
def _modulate(Y, rows, ok, cols, x, rstd, w, sc, sh, H: tl.constexpr, STREAM: tl.constexpr, BY_HAND: tl.constexpr):
    a = w.to(tl.float32)[None, :] * (1.0 + sc.to(tl.float32))
    _normalize_modulate(Y, rows, ok, cols, x, rstd, a, sh.to(tl.float32), H, STREAM, BY_HAND)


@triton.jit
def _x_again(X, rows, stride_x, cols, ok, H: tl.constexpr):
    """x read a second time (L1 or L2: just read), its last use: an eviction hint of its own, so the
    compiler cannot fold it into the first load and keep the row in registers after all."""
    mask = ok[:, None] & (cols < H)[None, :]
    return tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                   eviction_policy="evict_first").to(tl.float32)


@triton.jit(do_not_specialize=["n_rows"])
def _fwd_rows_kernel(X, W, SH, SC, IDX, Y, RSTD, n_rows, M, stride_x, stride_sh, stride_sc, eps,
                     H: tl.constexpr, ROWS: tl.constexpr, HEAD: tl.constexpr, TAIL: tl.constexpr,
                     L1_TABLES: tl.constexpr, RELOAD: tl.constexpr, SAVE_RSTD: tl.constexpr, BY_HAND: tl.constexpr):
    """ROWS rows per program in row order, w, sh[m], sc[m] gathered per row. A row is a HEAD-wide block
    (the largest power of two <= H: its mask folds away) and a TAIL-wide block for the rest, so H = 5376
    computes on 4096 + 2048 lanes instead of 8192. A bad index makes rstd, so the row, NaN. The tables are
    loaded after the sum of squares; x is held in registers until y, or (RELOAD) read again for y, which
    holds fewer registers across the table loads (the same arithmetic, the same bits)."""
    pos = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = pos < n_rows
    rows = pos.to(tl.int64)
    seg = segment(tl.load(IDX + rows, mask=ok, other=0), ok, M)
    m = tl.minimum(seg, M - 1).to(tl.int64)
    head = tl.arange(0, HEAD)
    if TAIL > 0:
        tail = HEAD + tl.arange(0, TAIL)
    x_head = _load_tile(X, rows, stride_x, head, ok, H, L1_TABLES).to(tl.float32)
    ss = tl.sum(x_head * x_head, axis=1)
    if TAIL > 0:
        x_tail = _load_tile(X, rows, stride_x, tail, ok, H, L1_TABLES).to(tl.float32)
        ss += tl.sum(x_tail * x_tail, axis=1)
    rstd = 1.0 / tl.sqrt(ss / H + eps)
    rstd = tl.where(seg < M, rstd, float("nan"))
    w_head, sc_head, sh_head = _tables(W, SH, SC, ok, m, head, H, stride_sh, stride_sc, L1_TABLES)
    if RELOAD:
        x_head = _x_again(X, rows, stride_x, head, ok, H)
    _modulate(Y, rows, ok, head, x_head, rstd, w_head, sc_head, sh_head, H, L1_TABLES, BY_HAND)
    if TAIL > 0:
        w_tail, sc_tail, sh_tail = _tables(W, SH, SC, ok, m, tail, H, stride_sh, stride_sc, L1_TABLES)
        if RELOAD:
            x_tail = _x_again(X, rows, stride_x, tail, ok, H)
        _modulate(Y, rows, ok, tail, x_tail, rstd, w_tail, sc_tail, sh_tail, H, L1_TABLES, BY_HAND)
    if SAVE_RSTD:
        tl.store(RSTD + rows, rstd, mask=ok)


@triton.jit(do_not_specialize=["n_rows", "CHUNK"])
def _fwd_walk_kernel(X, W, SH, SC, IDX, ORDER, KEYS, SCRATCH, Y, RSTD, n_rows, M, stride_x,
                     stride_sh, stride_sc, eps, CHUNK, H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
                     CMAX: tl.constexpr, K_P2: tl.constexpr, SAVE_RSTD: tl.constexpr, BY_HAND: tl.constexpr):
    """The global plan's walk: this program's slice of the plan in segment order, ROWS per step; a[m] and
    sh[m] loaded once per segment, so the only per-row traffic is x and y; the next step's rows are
    loaded before this step's arithmetic (across segment ends too). IDX is not read (the plan's KEYS hold
    the table rows); it keeps the parameter list of the launches measured."""
    GLOBAL: tl.constexpr = True
    pid, lo, n, n_seg, starts, counts, prev_key = _walk_begin(IDX, KEYS, SCRATCH, n_rows, M, CHUNK, CMAX, K_P2, GLOBAL)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    steps = tl.arange(0, ROWS)
    first_end = _first_slice_end(lo, n, starts, counts, SCRATCH, pid, CMAX, K_P2, GLOBAL)
    r_next = _rows_at(steps, steps < first_end, lo, ORDER, SCRATCH, pid, CMAX, GLOBAL)
    x_next = _load_tile(X, r_next, stride_x, cols, steps < first_end, H, False)
    for s in range(0, n_seg):
        key, s0, s1, after = _segment(s, lo, n, starts, counts, KEYS, SCRATCH, pid, CMAX, K_P2, GLOBAL)
        a = _scale(W, SC, key, M, cols, col_ok, stride_sc)
        m = tl.minimum(tl.maximum(key, 0), M - 1).to(tl.int64)
        sh = tl.load(SH + m * stride_sh + cols, mask=col_ok, other=0.0).to(tl.float32)
        for start in range(s0, s1, ROWS):
            ok = start + steps < s1
            rows = r_next
            x = x_next.to(tl.float32)
            n0, n1 = _next_step(start, s1, after, ROWS)
            r_next = _rows_at(n0 + steps, n0 + steps < n1, lo, ORDER, SCRATCH, pid, CMAX, GLOBAL)
            x_next = _load_tile(X, r_next, stride_x, cols, n0 + steps < n1, H, False)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
            rstd = tl.where((key >= 0) & (key < M), rstd, float("nan"))
            _normalize_modulate(Y, rows, ok, cols, x, rstd, a[None, :], sh[None, :], H, False, BY_HAND)
            if SAVE_RSTD:
                tl.store(RSTD + rows, rstd, mask=ok)




# --- backward --------------------------------------------------------------------------------------------

@triton.jit
def _row_grads(x, dy, a, rstd, H: tl.constexpr):
    """One tile's rows: (xhat, dx) with c = sum(g * xhat) / H per row (tl.sum over axis 1)."""
    xhat = x * rstd[:, None]
    c = tl.sum((dy * a) * xhat, axis=1) / H
    return _row_grads_given(x, dy, a, rstd, c)


@triton.jit
def _row_grads_given(x, dy, a, rstd, c):
    """(xhat, dx) of a tile's rows (or of a column block of them) whose c is known."""
    xhat = x * rstd[:, None]
    return xhat, (dy * a - xhat * c[:, None]) * rstd[:, None]


@triton.jit(do_not_specialize=["n_rows"])
def _bwd_dots_kernel(X, DY, W, SC, IDX, RSTD, C, n_rows, M, stride_x, stride_dy, stride_sc, H: tl.constexpr,
                     CB: tl.constexpr, N_CB: tl.constexpr, G: tl.constexpr):
    """The split backward's first pass: c[r] = sum(dy * a[m] * xhat) / H for G rows a program, in column
    chunks of CB, chunk 0 first (each row's own tl.sum tree per chunk: no other row enters it). A bad
    index has a NaN rstd (the forward's), so its c is NaN. Chunk c + 1's x and dy are loaded before chunk
    c's arithmetic (the one past the last masked off: no traffic): H200 at H = 12288, 383 us for the pass
    against 445 loading each chunk in turn, the same sums in the same order."""
    rows = tl.program_id(0) * G + tl.arange(0, G)
    ok = rows < n_rows
    key = tl.load(IDX + rows, mask=ok, other=0)
    m = tl.minimum(tl.maximum(key, 0), M - 1).to(tl.int64)
    rstd = tl.load(RSTD + rows, mask=ok, other=0.0)
    chunk = tl.arange(0, CB)
    dot = tl.zeros((G,), dtype=tl.float32)
    x_next, dy_next = _x_dy_tiles(X, DY, rows, stride_x, stride_dy, chunk, ok, H)
    for c in range(0, N_CB):
        cols = c * CB + chunk
        col_ok = cols < H
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        x_next, dy_next = _x_dy_tiles(X, DY, rows, stride_x, stride_dy, cols + CB, ok, H)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        sc = tl.load(SC + m[:, None] * stride_sc + cols[None, :], mask=ok[:, None] & col_ok[None, :],
                     other=0.0).to(tl.float32)
        dot += tl.sum((dy * (w[None, :] * (1.0 + sc))) * (x * rstd[:, None]), axis=1)
    tl.store(C + rows, dot / H, mask=ok)


@triton.jit
def _x_dy_tiles(X, DY, rows, stride_x, stride_dy, cols, ok, H: tl.constexpr):
    """x's and dy's [rows, cols] tiles as stored (the first pass's next chunk)."""
    return _load_tile(X, rows, stride_x, cols, ok, H, False), _load_tile(DY, rows, stride_dy, cols, ok, H, False)


@triton.jit
def _dw_row(M, GLOBAL: tl.constexpr):
    """Where a program's partial block keeps its dw partial, in rows of H (after the D and S rows)."""
    if GLOBAL:
        w_row = M * 0 + 4
    else:
        w_row = 2 * M
    return w_row


@triton.jit
def _meta(SCRATCH, CMAX: tl.constexpr):
    """The keys of the programs' partial slots, [2, programs] int32 after the walk lists."""
    return SCRATCH + tl.num_programs(0) * 2 * (CMAX + 2)


@triton.jit
def _plan_edges(KEYS, lo, n, n_rows, M, GLOBAL: tl.constexpr):
    """Global plan: (the table row at the slice's start, whether its segment began in an earlier
    program, the table row at the slice's end, whether its segment goes on into a later program)."""
    if GLOBAL:
        first = tl.load(KEYS + lo)
        last = tl.load(KEYS + lo + n - 1)
        before = (lo > 0) & (tl.load(KEYS + tl.maximum(lo - 1, 0)) == first)
        beyond = (lo + n < n_rows) & (tl.load(KEYS + tl.minimum(lo + n, n_rows - 1)) == last)
        first = _clamped(first, M)
        last = _clamped(last, M)
    else:
        first = lo
        last = lo
        before = lo < 0
        beyond = lo < 0
    return first, before, last, beyond


@triton.jit
def _zero_rows(DSH, DSC, z0, z1, cols, col_ok, stride_dsh, stride_dsc):
    """Table rows z0 .. z1 - 1 have no rows: zero gradients (dsh, dsc are contiguous [M, H], M*H < 2^31)."""
    for z in range(z0, z1):
        tl.store(DSH + z * stride_dsh + cols, tl.zeros(cols.shape, DSH.dtype.element_ty), mask=col_ok)
        tl.store(DSC + z * stride_dsc + cols, tl.zeros(cols.shape, DSC.dtype.element_ty), mask=col_ok)


@triton.jit
def _zero_gap(DSH, DSC, prev_key, key, M, cols, col_ok, stride_dsh, stride_dsc):
    """Global plan, at a segment's start: the table rows strictly between the previous position's key
    (clamped; -1 before the first row) and this one are unused (each gap belongs to the program holding
    the position after it; the last program also takes the rows after the last key: `_finish`)."""
    z0 = tl.maximum(tl.minimum(prev_key + 1, M), 0)
    z1 = tl.maximum(tl.minimum(key, M), 0)
    _zero_rows(DSH, DSC, z0, z1, cols, col_ok, stride_dsh, stride_dsc)


@triton.jit
def _flush(key, s0, s1, n, d, s, acc_w, base, W, SC, DSH, DSC, cols, col_ok, M, H: tl.constexpr, stride_sc,
           stride_dsh, stride_dsc, before, beyond, GLOBAL: tl.constexpr, BY_HAND: tl.constexpr):
    """End of a segment's rows in this program (d = its D, s = its S, for columns `cols`). Local plan:
    partial rows [p, key] and [p, M + key] (zeros when it had none). Global plan: dsh/dsc directly when the
    segment lies wholly in this program; else partial slot 0 (it began earlier) or 1 (it goes on later).
    Returns acc_w + (1 + sc[key]) * s. A bad index adds nothing."""
    valid = (key >= 0) & (key < M)
    m = tl.minimum(tl.maximum(key, 0), M - 1).to(tl.int64)
    if GLOBAL:
        cut_before = before & (s0 == 0)
        cut_after = beyond & (s1 == n)
        whole = valid & (cut_before == 0) & (cut_after == 0)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        done = cols < tl.where(whole, H, 0)
        tl.store(DSH + m * stride_dsh + cols, rounded(d, DSH.dtype.element_ty, BY_HAND), mask=done)
        tl.store(DSC + m * stride_dsc + cols, rounded(w * s, DSC.dtype.element_ty, BY_HAND), mask=done)
        slot = base + tl.where(cut_before, 0, 2) * H
        partial = cols < tl.where(valid & (cut_before | cut_after), H, 0)
        tl.store(slot + cols, d, mask=partial)
        tl.store(slot + H + cols, s, mask=partial)
    else:
        written = cols < tl.where(valid, H, 0)
        tl.store(base + m * H + cols, d, mask=written)
        tl.store(base + (M + m) * H + cols, s, mask=written)
    sc = tl.load(SC + m * stride_sc + cols, mask=col_ok, other=0.0).to(tl.float32)
    return acc_w + tl.where(valid, (1.0 + sc) * s, 0.0)


@triton.jit
def _finish(META, KEYS, DSH, DSC, pid, lo, n, n_rows, n_seg, first, before, last, beyond, M, cols, col_ok,
            stride_dsh, stride_dsc, GLOBAL: tl.constexpr):
    """Global plan, after the walk: the keys of this program's partial slots (-1: none) for the combine,
    and, in the last program, zeros for the table rows after the last used one."""
    if GLOBAL:
        first_ok = (first >= 0) & (first < M)
        last_ok = (last >= 0) & (last < M)
        slot1 = beyond & last_ok & ((before & (n_seg == 1)) == 0)
        tl.store(META + pid, tl.where(before & first_ok, first, -1).to(tl.int32))
        tl.store(META + tl.num_programs(0) + pid, tl.where(slot1, last, -1).to(tl.int32))
        end = lo + n == n_rows
        z0 = tl.where(end, tl.maximum(tl.minimum(last + 1, M), 0), 0)
        z1 = tl.where(end, M, 0)
        _zero_rows(DSH, DSC, z0, z1, cols, col_ok, stride_dsh, stride_dsc)


@triton.jit(do_not_specialize=["n_rows", "CHUNK"])
def _bwd_kernel(X, DY, DX, W, SC, RSTD, IDX, ORDER, KEYS, SCRATCH, PART, DSH, DSC, C, n_rows, M,
                stride_x, stride_dy, stride_dx, stride_sc, stride_dsh, stride_dsc, CHUNK, PSTRIDE,
                H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, CMAX: tl.constexpr, K_P2: tl.constexpr,
                GLOBAL: tl.constexpr, PARAMS: tl.constexpr, COLS: tl.constexpr, BY_HAND: tl.constexpr):
    """Whole rows in registers: this program's rows in segment order, ROWS per step, the next step's x and
    dy loaded before this step's arithmetic (across segment ends too: H200, R = 32768, H = 5376, the
    rows kernel 337 us against 496 loading each step in turn); D, S and the dw partial in fp32 registers.
    COLS (the split backward): columns [program_id(1) * BLOCK_H, + BLOCK_H) of the rows only, with c from
    C (`_bwd_dots_kernel`), and the next step's rstd and c loaded with its x and dy (a block's step moves
    few bytes: no load may wait in turn); every block's program makes the same walk lists (the same
    values written to the same scratch words, each program reading back its own writes)."""
    pid, lo, n, n_seg, starts, counts, prev_key = _walk_begin(IDX, KEYS, SCRATCH, n_rows, M, CHUNK, CMAX, K_P2, GLOBAL)
    first, before, last, beyond = _plan_edges(KEYS, lo, n, n_rows, M, GLOBAL)
    if COLS:
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    else:
        cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    steps = tl.arange(0, ROWS)
    if PARAMS:  # without parameter gradients PART, DSH and DSC are None
        base = PART + pid.to(tl.int64) * PSTRIDE
    first_end = _first_slice_end(lo, n, starts, counts, SCRATCH, pid, CMAX, K_P2, GLOBAL)
    r_next = _rows_at(steps, steps < first_end, lo, ORDER, SCRATCH, pid, CMAX, GLOBAL)
    x_next = _load_tile(X, r_next, stride_x, cols, steps < first_end, H, False)
    dy_next = _load_tile(DY, r_next, stride_dy, cols, steps < first_end, H, False)
    if COLS:
        rstd_next, c_next = _row_scalars(RSTD, C, r_next, steps < first_end)
    acc_w = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for s in range(0, n_seg):
        key, s0, s1, after = _segment(s, lo, n, starts, counts, KEYS, SCRATCH, pid, CMAX, K_P2, GLOBAL)
        if PARAMS:
            if GLOBAL:
                _zero_gap(DSH, DSC, prev_key, key, M, cols, col_ok, stride_dsh, stride_dsc)
                prev_key = key
        a = _scale(W, SC, key, M, cols, col_ok, stride_sc)[None, :]
        acc_d = tl.zeros((BLOCK_H,), dtype=tl.float32)
        acc_s = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for start in range(s0, s1, ROWS):
            ok = start + steps < s1
            rows = r_next
            x = x_next.to(tl.float32)
            dy = dy_next.to(tl.float32)
            n0, n1 = _next_step(start, s1, after, ROWS)
            r_next = _rows_at(n0 + steps, n0 + steps < n1, lo, ORDER, SCRATCH, pid, CMAX, GLOBAL)
            x_next = _load_tile(X, r_next, stride_x, cols, n0 + steps < n1, H, False)
            dy_next = _load_tile(DY, r_next, stride_dy, cols, n0 + steps < n1, H, False)
            if COLS:
                rstd, c = rstd_next, c_next
                rstd_next, c_next = _row_scalars(RSTD, C, r_next, n0 + steps < n1)
                xhat, dx = _row_grads_given(x, dy, a, rstd, c)
            else:
                rstd = tl.load(RSTD + rows, mask=ok, other=0.0)
                xhat, dx = _row_grads(x, dy, a, rstd, H)
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :], rounded(dx, DX.dtype.element_ty, BY_HAND),
                     mask=ok[:, None] & col_ok[None, :])
            if PARAMS:
                acc_d += tl.sum(dy, axis=0)
                acc_s += tl.sum(dy * xhat, axis=0)
        if PARAMS:
            acc_w = _flush(key, s0, s1, n, acc_d, acc_s, acc_w, base, W, SC, DSH, DSC, cols, col_ok, M, H,
                           stride_sc, stride_dsh, stride_dsc, before, beyond, GLOBAL, BY_HAND)
    if PARAMS:
        tl.store(base + _dw_row(M, GLOBAL) * H + cols, acc_w, mask=col_ok)
        _finish(_meta(SCRATCH, CMAX), KEYS, DSH, DSC, pid, lo, n, n_rows, n_seg, first, before, last, beyond, M,
                cols, col_ok, stride_dsh, stride_dsc, GLOBAL)


@triton.jit
def _row_scalars(RSTD, C, rows, ok):
    """The split backward: rstd and c of a step's rows (zeros where masked off)."""
    rstd = tl.load(RSTD + rows, mask=ok, other=0.0)
    c = tl.load(C + rows, mask=ok, other=0.0)
    return rstd, c


@triton.jit(do_not_specialize=["n_programs"])
def _bwd_params_kernel(PART, W, DW, DSH, DSC, n_programs, M, PSTRIDE, stride_dsh, stride_dsc,
                       H: tl.constexpr, BLOCK_C: tl.constexpr, P_TILE: tl.constexpr, BY_HAND: tl.constexpr):
    """Local plan. Program (c, m): dsh[m] and dsc[m] for column block c; program (c, M): dw. Each sums
    one partial row of every backward program (`sum_partials`), so all run at once."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    m = tl.program_id(1)
    if m < M:
        d = sum_partials(PART + m * H, n_programs, PSTRIDE, cols, col_ok, P_TILE)
        s = sum_partials(PART + (M + m) * H, n_programs, PSTRIDE, cols, col_ok, P_TILE)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        tl.store(DSH + m * stride_dsh + cols, rounded(d, DSH.dtype.element_ty, BY_HAND), mask=col_ok)
        tl.store(DSC + m * stride_dsc + cols, rounded(w * s, DSC.dtype.element_ty, BY_HAND), mask=col_ok)
    else:
        dw = sum_partials(PART + 2 * M * H, n_programs, PSTRIDE, cols, col_ok, P_TILE)
        tl.store(DW + cols, rounded(dw, DW.dtype.element_ty, BY_HAND), mask=col_ok)


@triton.jit(do_not_specialize=["n_programs"])
def _bwd_combine_kernel(PART, SCRATCH, W, DW, DSH, DSC, n_programs, PSTRIDE, META_AT, stride_dsh, stride_dsc,
                        H: tl.constexpr, BLOCK_C: tl.constexpr, P_TILE: tl.constexpr, BY_HAND: tl.constexpr):
    """Global plan. Program (c, q): if backward program q left a segment unfinished (slot 1, key
    META[1, q]), its dsh and dsc for column block c: q's slot 1 plus, tiles of P_TILE left to right, the
    slot 0 of the programs after q that hold the rest of it (those whose META[0] is that key: they
    follow q). Program (c, n_programs): dw, the programs' dw partials added in tiles."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < H
    q = tl.program_id(1)
    META = SCRATCH + META_AT
    if q < n_programs:
        key = tl.load(META + n_programs + q)
        if key >= 0:
            count = key * 0
            for t in range(0, n_programs, P_TILE):
                p = t + tl.arange(0, P_TILE)
                count += tl.sum((tl.load(META + p, mask=p < n_programs, other=-1) == key).to(tl.int32), axis=0)
            owner = PART + q.to(tl.int64) * PSTRIDE
            rest = owner + PSTRIDE
            d = tl.load(owner + 2 * H + cols, mask=col_ok, other=0.0) + \
                sum_partials(rest, count, PSTRIDE, cols, col_ok, P_TILE)
            s = tl.load(owner + 3 * H + cols, mask=col_ok, other=0.0) + \
                sum_partials(rest + H, count, PSTRIDE, cols, col_ok, P_TILE)
            w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
            m = key.to(tl.int64)
            tl.store(DSH + m * stride_dsh + cols, rounded(d, DSH.dtype.element_ty, BY_HAND), mask=col_ok)
            tl.store(DSC + m * stride_dsc + cols, rounded(w * s, DSC.dtype.element_ty, BY_HAND), mask=col_ok)
    else:
        dw = sum_partials(PART + 4 * H, n_programs, PSTRIDE, cols, col_ok, P_TILE)
        tl.store(DW + cols, rounded(dw, DW.dtype.element_ty, BY_HAND), mask=col_ok)


# --- launchers ---------------------------------------------------------------------------------------
# The host path is kept short on purpose (kernels/notes/norm_modulate.md, "Host path"): everything that
# depends on the shapes only is computed once per (R, H, M, plan, config, device) and cached
# (`_fwd_recipe`, `_bwd_recipe`); unused pointers are passed as None (a constexpr: no data_ptr() call at
# launch); outputs come from empty_like where it applies (half the host cost of torch.empty here).

def walks_plan(cfg: LaunchConfig) -> bool:
    """Whether the forward walks the global plan when there is one (M > local_max): `_fwd_walk_kernel`."""
    return cfg.plan_walk_rows > 0


def wants_plan(table_rows: int, training: bool, cfg: LaunchConfig) -> bool:
    """The global plan is used when M > local_max: always for a backward (the forward and the backward
    share it), for an inference call when the forward walks it."""
    return table_rows > cfg.local_max and (training or walks_plan(cfg))


@functools.lru_cache(maxsize=64)
def _head_tail(hidden: int) -> tuple[int, int]:
    head = 1 << (hidden.bit_length() - 1)
    return head, (next_power_of_2(hidden - head) if hidden > head else 0)


def _geometry(rows: int, device: int, programs_per_sm: int, chunk_limit: int) -> tuple[int, int, int]:
    """(programs, rows per program, CMAX) of a walk over `rows` rows (`split_rows`); device -1: CPU."""
    where = torch.device("cuda", device) if device >= 0 else torch.device("cpu")
    programs, chunk = split_rows(rows, where, programs_per_sm, chunk_limit)
    return programs, chunk, next_power_of_2(chunk)


@functools.lru_cache(maxsize=512)
def _fwd_recipe(rows: int, hidden: int, table_rows: int, global_plan: bool, save_rstd: bool, cfg: LaunchConfig,
                device: int) -> tuple:
    """(kernel, grid, constexprs and warps, scratch int32 elements, CHUNK, token) of a forward launch. The
    token (a fresh object per recipe) stands in a launch key for everything the recipe fixes."""
    if not (global_plan and walks_plan(cfg)):
        head, tail = _head_tail(hidden)
        meta = dict(H=hidden, ROWS=cfg.fwd_rows, HEAD=head, TAIL=tail, L1_TABLES=cfg.fwd_l1_tables,
                    RELOAD=cfg.fwd_reload, SAVE_RSTD=save_rstd, BY_HAND=BY_HAND, num_warps=cfg.fwd_warps)
        return _fwd_rows_kernel, (cdiv(rows, cfg.fwd_rows),), meta, 0, 0, object()
    programs, chunk, cmax = _geometry(rows, device, cfg.plan_walk_programs_per_sm, cfg.chunk_limit)
    meta = dict(H=hidden, BLOCK_H=cfg.block_h, ROWS=cfg.plan_walk_rows, CMAX=cmax, K_P2=_k_p2(table_rows, True),
                SAVE_RSTD=save_rstd, BY_HAND=BY_HAND, num_warps=cfg.plan_walk_warps)
    return _fwd_walk_kernel, (programs,), meta, programs * 2 * (cmax + 2), chunk, object()


def _k_p2(table_rows: int, global_plan: bool) -> int:
    return 2 if global_plan else next_power_of_2(table_rows + 2)


def forward(x2d: torch.Tensor, w: torch.Tensor, sh: torch.Tensor, sc: torch.Tensor, idx: torch.Tensor,
            eps: float, save_rstd: bool = True, config: Optional[LaunchConfig] = None,
            plan: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
            out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(y, rstd) for rows x2d [R, H] (unit inner stride) and idx [R]; rstd is None unless save_rstd.
    `plan`: the global plan (`make_plan`); the plan walk needs one when M > local_max (made here then).
    `out`: y's storage, `torch.empty_like(x2d)` from the caller (a graph replay's fixed output)."""
    rows, hidden = x2d.shape
    y = torch.empty_like(x2d) if out is None else out  # x2d has unit inner stride: y is [R, H] contiguous
    # sizes as int arguments, not a tuple: torch's argument parser takes them faster (tools/hostcost_cpu.py)
    rstd = x2d.new_empty(rows, dtype=torch.float32) if save_rstd else None
    if rows == 0:
        return y, rstd
    cfg = config or launch_config(hidden)
    table_rows = sh.shape[0]
    if plan is None and table_rows > cfg.local_max and walks_plan(cfg):
        plan = make_plan(idx, table_rows)
    device = x2d.get_device()
    kernel, grid, meta, scratch_len, chunk, token = _fwd_recipe(rows, hidden, table_rows, plan is not None,
                                                                save_rstd, cfg, device)
    strides = (x2d.stride()[0], sh.stride()[0], sc.stride()[0])
    # The launch's key (kernels.common.launch_keyed): the recipe's token (kernel, grid, constexprs, R, M),
    # the strides (specialized ints), the dtype and 16-byte alignment of every tensor the caller passed;
    # y, rstd and the scratch are fresh allocations here.
    key = (token, strides, tensor_key(x2d), tensor_key(w), tensor_key(sh), tensor_key(sc), tensor_key(idx))
    if scratch_len:  # the plan walk
        keys, order = plan
        scratch = x2d.new_empty(scratch_len, dtype=torch.int32)
        args = (x2d, w, sh, sc, idx, order, keys, scratch, y, rstd, rows, table_rows, *strides, eps, chunk)
        key += (tensor_key(keys), tensor_key(order))
    else:
        args = (x2d, w, sh, sc, idx, y, rstd, rows, table_rows, *strides, eps)
    launch_keyed(kernel, grid, device, key, args, meta)
    return y, rstd


def backward_split(rows: int, cfg: LaunchConfig, device: torch.device) -> tuple[int, int]:
    """(programs, rows per program) of the backward (`split_rows`)."""
    return split_rows(rows, device, cfg.bwd_programs_per_sm, cfg.chunk_limit)


def partial_rows(table_rows: int, global_plan: bool) -> int:
    """fp32 rows of H per backward program: the bound on partial memory (module docstring)."""
    return 5 if global_plan else 2 * table_rows + 1


def dots_meta(hidden: int, cfg: LaunchConfig) -> dict:
    """`_bwd_dots_kernel`'s constexprs and warps for rows of `hidden` under `cfg`."""
    return dict(H=hidden, CB=cfg.dots_chunk, N_CB=cdiv(hidden, cfg.dots_chunk), G=cfg.dots_rows,
                num_warps=cfg.dots_warps)


@functools.lru_cache(maxsize=512)
def _bwd_recipe(rows: int, hidden: int, table_rows: int, need_params: bool, cfg: LaunchConfig, device: int) -> tuple:
    """Everything of a backward that depends on the shapes only: (global plan, programs, CHUNK, CMAX,
    partial stride, scratch int32 elements, `_bwd_kernel`'s grid and constexprs, the split backward's
    first pass (grid, constexprs) or None, (parameter stage kernel, grid, constexprs), token: a fresh
    object per recipe, standing in the launch keys for everything the recipe fixes)."""
    global_plan = table_rows > cfg.local_max
    pstride = partial_rows(table_rows, global_plan) * hidden
    if max(pstride, table_rows * hidden) >= 2 ** 31:
        raise ValueError(f"tables of {table_rows} rows of {hidden} are too large for this kernel's int32 offsets")
    programs, chunk, cmax = _geometry(rows, device, cfg.bwd_programs_per_sm, cfg.chunk_limit)
    # enable_fp_fusion off (cfg.bwd_fp_fusion, False but in a measuring preset): PARAMS (a constexpr) makes two
    # compilations of `_bwd_kernel`, and with contraction
    # on, LLVM fused a different product of dx = (dy * a - xhat * c) * rstd into an FMA in each (the one whose
    # operands have fewer other uses; with PARAMS, xhat and dy also feed the parameter sums), so dx moved by
    # 1-2 ULP when the parameters need no gradient. Without contraction every operation is rounded as
    # written (PTX `.rn`, which ptxas does not fuse either): both compilations evaluate dx alike
    # (kernels/notes/norm_modulate.md, "dx whatever gradients are requested").
    meta = dict(H=hidden, CMAX=cmax, K_P2=_k_p2(table_rows, global_plan), GLOBAL=global_plan, PARAMS=need_params,
                BY_HAND=BY_HAND, num_warps=cfg.bwd_warps, enable_fp_fusion=cfg.bwd_fp_fusion)
    if cfg.bwd_cols:
        meta.update(BLOCK_H=cfg.bwd_cols, ROWS=cfg.bwd_rows, COLS=True)
        grid = (programs, cdiv(hidden, cfg.bwd_cols))
        dots = ((cdiv(rows, cfg.dots_rows),), dots_meta(hidden, cfg))
    else:
        meta.update(BLOCK_H=cfg.block_h, ROWS=cfg.bwd_rows, COLS=False)
        grid = (programs,)
        dots = None
    if global_plan:
        block_c = cfg.param_cols if INTERPRETED else 128
        params = (_bwd_combine_kernel, (cdiv(hidden, block_c), programs + 1),
                  dict(H=hidden, BLOCK_C=block_c, P_TILE=param_tile(programs, 32), BY_HAND=BY_HAND, num_warps=4))
    else:
        params = (_bwd_params_kernel, (cdiv(hidden, cfg.param_cols), table_rows + 1),
                  dict(H=hidden, BLOCK_C=cfg.param_cols, P_TILE=param_tile(programs, cfg.param_tile),
                       BY_HAND=BY_HAND, num_warps=4))
    scratch_len = programs * 2 * (cmax + 2) + (2 * programs if global_plan else 0)
    return global_plan, programs, chunk, cmax, pstride, scratch_len, grid, meta, dots, params, object()


def backward(dy: torch.Tensor, x2d: torch.Tensor, w: torch.Tensor, sc: torch.Tensor, idx: torch.Tensor,
             rstd: torch.Tensor, table_rows: int, sh_dtype: torch.dtype, need_params: bool,
             config: Optional[LaunchConfig] = None, plan: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
             out: Optional[tuple[torch.Tensor, torch.Tensor]] = None
             ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(dx, dw, dsh, dsc), each in its input's dtype (dsh in sh_dtype); the last three None unless
    need_params. `plan`: the forward's global plan when M > local_max (made here if not given).
    `out`: (dsh, dsc) to write instead of allocating them (with need_params), each [table_rows, >= H]
    in sh_dtype / sc's dtype with unit inner stride and any row stride; columns [0, H) of each are
    written (every row: rows no index names get zeros) and the two are returned as given. The AdaLN
    callers pass the halves of one [M, 2H] buffer: dsh as the whole buffer (row stride 2H), dsc as its
    second column half, so the gradient of the table [sh | sc] needs no concatenation."""
    rows, hidden = x2d.shape
    if rows == 0:
        dx = torch.empty_like(x2d)
        if out is not None:
            for t in out:
                t.narrow(1, 0, hidden).zero_()
            return dx, torch.zeros_like(w), out[0], out[1]
        return (dx, torch.zeros_like(w), x2d.new_zeros((table_rows, hidden), dtype=sh_dtype),
                x2d.new_zeros((table_rows, hidden), dtype=sc.dtype))
    # Fresh contiguous [R, H] and [M, H] buffers have row stride H (no stride() call); sizes are passed as
    # int arguments, not tuples (torch's argument parser takes them faster: tools/hostcost_cpu.py).
    dx = x2d.new_empty(rows, hidden)
    cfg = config or launch_config(hidden)
    device = x2d.get_device()
    global_plan, programs, chunk, cmax, pstride, scratch_len, grid, meta, dots, params, token = _bwd_recipe(
        rows, hidden, table_rows, need_params, cfg, device)
    if global_plan and plan is None:
        plan = make_plan(idx, table_rows)
    keys, order = plan if global_plan else (None, None)
    scratch = x2d.new_empty(scratch_len, dtype=torch.int32)
    if need_params:
        partials = x2d.new_empty(programs * pstride, dtype=torch.float32)  # [programs, pstride], flat
        # Three allocations, not views of one buffer: autograd handles views of a shared buffer at a host cost
        # (kernels/notes/norm_modulate.md, "Host path", has the figure).
        dw = torch.empty_like(w)
        if out is None:
            dsh = x2d.new_empty(table_rows, hidden, dtype=sh_dtype)
            dsc = x2d.new_empty(table_rows, hidden, dtype=sc.dtype)
            strides = (hidden, hidden)
        else:
            dsh, dsc = out
            strides = (dsh.stride()[0], dsc.stride()[0])
    else:
        partials = dw = dsh = dsc = None  # never touched (PARAMS is a constexpr)
        strides = (0, 0)
    row_idx = idx if not global_plan else None
    in_strides = (x2d.stride()[0], dy.stride()[0], sc.stride()[0])
    # The launches' keys (kernels.common.launch_keyed), as the forward's: the recipe's token, the strides,
    # every tensor that comes from outside this function (dx, the scratch, the partials, dw and fresh
    # dsh / dsc are allocated here).
    given = out is not None and need_params
    tables = ((tensor_key(dsh), tensor_key(dsc)) if given else (sh_dtype, sc.dtype), strides, tensor_key(w))
    key = (token, in_strides, tables, tensor_key(x2d), tensor_key(dy), tensor_key(sc), tensor_key(rstd),
           None if row_idx is None else tensor_key(row_idx),
           None if order is None else (tensor_key(keys), tensor_key(order)))
    args = (x2d, dy, dx, w, sc, rstd, row_idx, order, keys, scratch, partials, dsh, dsc)
    if dots is not None:  # the split backward: every row's c first, into a fresh [R] fp32 buffer
        c = x2d.new_empty(rows, dtype=torch.float32)
        launch_keyed(_bwd_dots_kernel, dots[0], device, (token, "dots", key[1:], tensor_key(idx)),
                     (x2d, dy, w, sc, idx, rstd, c, rows, table_rows, *in_strides), dots[1])
    else:
        c = None
    launch_keyed(_bwd_kernel, grid, device, key,
                 args + (c, rows, table_rows, in_strides[0], in_strides[1], hidden, in_strides[2], *strides, chunk,
                         pstride), meta)
    if not need_params:
        return dx, None, None, None
    params_kernel, params_grid, params_meta = params
    if global_plan:
        args = (partials, scratch, w, dw, dsh, dsc, programs, pstride, programs * 2 * (cmax + 2), *strides)
    else:
        args = (partials, w, dw, dsh, dsc, programs, table_rows, pstride, *strides)
    launch_keyed(params_kernel, params_grid, device, (token, "params", tables), args, params_meta)
    return dx, dw, dsh, dsc
