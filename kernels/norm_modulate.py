"""norm_modulate in Triton: batch-invariant, deterministic, fp32 inside, one rounding per output.

    y = xhat * a[m] + sh[m],   xhat = x * rstd,  rstd = 1 / sqrt(sum(x^2) / H + eps),  a[m] = w * (1 + sc[m])
    dx = (g - xhat * c) * rstd,   g = dy * a[m],  c = sum(g * xhat) / H
    dsh[m] = D[m],  dsc[m] = w * S[m],  dw = sum over m of (1 + sc[m]) * S[m]
    where D[m] = sum of dy and S[m] = sum of dy * xhat over the rows r with idx[r] = m.

Dtypes: x, w, sh and sc are each bf16, fp16 or fp32, independently. All arithmetic is fp32; y and dx come
out in x's dtype, dw in w's, dsh in sh's, dsc in sc's; every output is rounded once, to nearest even, at
its store. A row whose index is outside [0, M) comes out NaN (y and dx) and adds nothing to any gradient.

Kernels (all launch settings in `LaunchConfig`, a function of H and the device only: `launch_config`)
* forward, one place (`_normalize_modulate` does the arithmetic), two ways to walk the rows:
  `_fwd_rows_kernel` gathers w, sh[m], sc[m] for every row (ROWS rows per program, in row order or in
  the global plan's order; above H = 4096 x is read again for y instead of held in registers across the
  table loads); `_fwd_walk_kernel` walks a program's rows sorted by table row and loads
  a[m] = w * (1 + sc[m]) and sh[m] once per segment, with the next ROWS rows prefetched. Defaults: the
  per-row forward, and above H = 4096 under the global plan (M > local_max) the walk (`plan_walk_rows`:
  the tables are read once per segment instead of once per row, kernels/NOTES.md v33).
* backward, one place (`_row_grads` does the arithmetic), two ways to hold a row: `_bwd_kernel` keeps
  whole rows and the fp32 sums in registers (ROWS rows per step, the next step prefetched);
  `_bwd_chunked_kernel` (wide H: a whole row no longer fits in registers) takes G rows at a time in
  column chunks of CB: one pass for the rows' dot products, a second (from L2) for dx and the sums,
  which live in a program-private fp32 workspace. Or (wide H, `LaunchConfig.bwd_cols`) split in two:
  `_bwd_dots_kernel` makes every row's c first, then `_bwd_kernel` runs once per column block of
  bwd_cols with c given (each (program, block) walks the program's rows for its columns only); or
  (`split_dots`, a variant) one launch whose column blocks make c from their partial dots. Then
  `_bwd_params_kernel` (local plan) or `_bwd_combine_kernel` (global plan) makes dw, dsh, dsc.

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

Partial memory (fp32 bytes): local 4*P*(2M + 1)*H with M <= local_max; global 20*P*H; the chunked
backward adds a 2-row workspace per program (8*P*H), the split backward c, 4*R bytes (its "exchange"
variant the blocks' partials instead, 4*NB*R, and int32 counts). P = programs of the backward
(`backward_split`: about SMs x bwd_programs_per_sm, at least ceil(R / chunk_limit); the one-launch split
variants: ranges of NB blocks, about SMs x bwd_programs_per_sm / NB of them).

Reduction orders (the point of this kernel: change them only with the probes rerun):

* Per row, forward and dx. Each sum over H is made per row of a [ROWS, width] tile by tl.sum over
  axis 1: each thread adds its own contiguous elements, lanes combine by butterfly shuffles, warps
  through shared memory. `_fwd_rows_kernel` sums the squares over a HEAD-wide block (the largest power
  of two <= H) plus a TAIL-wide block (the rest), in that order; `_fwd_walk_kernel` and `_bwd_kernel`
  over one BLOCK_H-wide block; `_bwd_chunked_kernel` sums c over column chunks of CB, chunk 0 first,
  left to right, and `_bwd_dots_kernel` likewise over chunks of DOTS_CHUNK ([DOTS_ROWS, DOTS_CHUNK]
  tiles on DOTS_WARPS warps); the fused backward's producers (`bwd_fused`) the same chunks of the same
  tiles on the column blocks' bwd_warps warps (`_row_dots`, rows in the walk's order: which rows share a
  tile changes no row's tree); without a first pass (`split_dots` "exchange" or "recompute") c adds the
  column blocks' sums (each a tl.sum over a [ROWS, bwd_cols] tile's row on bwd_warps warps), block 0 first.
  The atomics of the fused and exchange launches hand out roles and count positions done; no value goes
  through them. Tile shapes, chunk widths and warp counts are functions of H (LaunchConfig), every row
  of a tile has the same layout, and masked-off rows are zeros in rows of their own: nothing in a row's
  tree depends on R, the grid, the plan or the row's position, so a row's y and dx are bitwise the same
  alone or in any batch (for a given LaunchConfig; different configs are different trees). Which
  forward kernel runs depends on H and on M > local_max (the plan walk above H = 4096), never on R or
  the grad mode: at one (H, M) training and inference give the same y bits.
* Parameter gradients: cross-row sums in a fixed order, without atomics. Within a program, for each
  of its segments in turn (its rows in ascending row order, both plans): per column, D and S add one
  step's tl.sum over its ROWS (or G) rows (axis 0) at a time, steps in list order. Local plan:
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

from h3bench.kernels.common import (BY_HAND, INTERPRETED, cdiv, launch_keyed, local_order, param_tile, pick, rounded, segment,
                            next_power_of_2, split_row_chunks, split_rows, sum_partials, tensor_key)
# the global plan (rows sorted stably by table row; NOTES.md v31), called as K.make_plan by the API too
from h3bench.kernels.plan import make_plan

MAX_HIDDEN = 32768
# The split backward's first pass (`_bwd_dots_kernel`): [DOTS_ROWS, DOTS_CHUNK] tiles on DOTS_WARPS warps;
# part of c's order (chunks of DOTS_CHUNK, chunk 0 first).
DOTS_ROWS, DOTS_CHUNK, DOTS_WARPS = 2, 2048, 4
SPLIT_DOTS = ("pass", "exchange", "recompute")   # LaunchConfig.split_dots
# True only while a test runs the interpreter's programs at once (tests/concurrent_grid.py; the backward
# recipes cached before must be dropped): programs that wait for each other can then run under it too
PROGRAMS_AT_ONCE = False
LOCAL_MAX = 16                     # default local_max: the local plan's one-hot sort is [CMAX, M + 2] wide
INFERENCE_SORT_BYTES = 16 << 20    # an inference call sorts rows first when sh + sc exceed this (L2 reuse)


@dataclass(frozen=True, eq=False)  # hashed by identity: a cheap key for the launch recipes
class LaunchConfig:
    """How the kernels are launched for one H. Part of the reduction order (tile shapes, warps, the
    backward's split), so a function of H and the device only; tools/sweep_norm_modulate.py and
    tools/bench_norm_modulate.py pass variants of it to compare them."""

    block_h: int                   # next power of two >= H (the backward's row vector; row_gather's too)
    fwd_kernel: str                # "rows": tables gathered per row; "walk": sorted rows, tables per segment
    fwd_rows: int                  # rows per program ("rows") or per step ("walk")
    fwd_warps: int
    bwd_rows: int                  # rows per step (whole rows in registers) or per group (chunked)
    bwd_warps: int
    bwd_programs_per_sm: int
    bwd_chunk: int = 0             # 0: whole rows in registers; else the chunked backward's column chunk
    bwd_prefetch: bool = False     # chunked backward: each chunk's x and dy loaded one chunk ahead (same bits)
    # > 0: the split backward (every row's c first, then column blocks of this width, bwd_rows rows a step;
    # the default above SPLIT_ABOVE); 0 with bwd_chunk 0: whole rows in registers
    bwd_cols: int = 0
    fwd_programs_per_sm: int = 2   # "walk" only
    fwd_l1_tables: bool = False    # "rows" only: x read past L1 (.cg), y stored evict_first, tables kept
    # "rows" only, global plan (M > local_max): programs take rows in the plan's order (True: rows of one
    # table row together, so their sh[m], sc[m] are shared in L2) or in row order (False, the default:
    # one dependent load less per row, the plan's position -> the row; H200 at H = 5376, R = 32768,
    # stream: M = 1024 forward 352-365 us against 420, M = 4096 422-426 against 432, kernels/NOTES.md v22).
    # Rows are independent: y and rstd are the same bits either way.
    fwd_ordered: bool = False
    # "rows" only, when the loads are issued (the same bits either way; kernels/NOTES.md v33): the tables
    # before x (one wait for a row's loads; more registers held), x read again for y (fewer held)
    fwd_tables_first: bool = False
    fwd_reload: bool = False
    # "rows" only: > 0: under the global plan (M > local_max, training and inference alike) the forward is
    # the walk instead, plan_walk_rows rows a step on plan_walk_warps warps, fwd_programs_per_sm programs an
    # SM (H200, H = 5376: M = 1024 204 us against the per-row forward's 259, M = 4096 221 against 310;
    # kernels/NOTES.md v33). 0: the per-row forward under the plan too
    plan_walk_rows: int = 0
    plan_walk_warps: int = 8
    local_max: int = LOCAL_MAX     # M <= local_max: local plan; above: global plan
    chunk_limit: int = 1024        # rows per program at most (the local sort is a [CMAX, M + 2] one-hot)
    param_cols: int = 32           # parameter stage: columns per program (each width its own fixed tl.sum trees)
    param_tile: int = 256          # parameter stage: partial rows per tl.sum, at most
    # the split backward's first pass (`_bwd_dots_kernel`): [dots_rows, dots_chunk] tiles on dots_warps warps
    # (part of c's order: chunks of dots_chunk, chunk 0 first); dots_prefetch: each chunk's x and dy loaded
    # one chunk ahead (the same sums in the same order: the same bits), more bytes in flight a program
    dots_rows: int = DOTS_ROWS
    dots_chunk: int = DOTS_CHUNK
    dots_warps: int = DOTS_WARPS
    dots_prefetch: bool = False
    # the split backward with its first pass in the same launch (`_bwd_kernel` FUSED, kernels/NOTES.md v39):
    # one producer program a range computes c (dots_rows rows a step, dots_chunk columns a chunk) while the
    # range's column blocks consume it, so x and dy can come from L2 the second time (6RH of DRAM, not 10RH)
    bwd_fused: bool = False
    fused_producers: int = 1       # producer programs a range (they take its steps in turn)
    # the split backward's c (kernels/NOTES.md v41): "pass", a first launch (`_bwd_dots_kernel`, 10RH bytes of
    # DRAM); or no first pass, c summed from the column blocks' own partial dots, block 0 first (another tree:
    # other dx bits): "exchange", the NB programs of a range post their partials and wait for each other's
    # (6RH of DRAM), or "recompute", each program makes every block's partial itself from the whole rows
    # (6RH of DRAM while a range's programs read the same rows together, the others' columns from L2)
    split_dots: str = "pass"
    # with split_dots "exchange" or "recompute": each step's dx made one step late, after the next step's
    # partials are posted (a program then waits for partials its range posted a step ago; kernels/NOTES.md v42)
    dots_ahead: bool = False

    def __post_init__(self):
        if self.fwd_kernel not in ("rows", "walk"):
            raise ValueError(f"fwd_kernel must be 'rows' or 'walk', got {self.fwd_kernel!r}")
        for name in ("fwd_rows", "bwd_rows", "bwd_chunk", "bwd_cols", "block_h", "plan_walk_rows", "dots_rows",
                     "dots_chunk"):
            value = getattr(self, name)
            if value and value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.fused_producers < 1:
            raise ValueError(f"fused_producers must be >= 1, got {self.fused_producers}")
        if self.bwd_fused and not self.bwd_cols:
            raise ValueError("bwd_fused fuses the split backward's two passes: it needs bwd_cols > 0")
        if self.split_dots not in SPLIT_DOTS:
            raise ValueError(f"split_dots must be one of {', '.join(SPLIT_DOTS)}, got {self.split_dots!r}")
        if self.split_dots != "pass" and (not self.bwd_cols or self.bwd_fused):
            raise ValueError(f"split_dots={self.split_dots!r} makes the split backward's c from its column blocks: "
                             "it needs bwd_cols > 0 and bwd_fused off")
        if self.dots_ahead and self.split_dots == "pass":
            raise ValueError("dots_ahead holds a step back for the column blocks' partials: it needs split_dots "
                             "'exchange' or 'recompute'")
        if self.bwd_chunk and self.bwd_cols:
            raise ValueError(f"bwd_chunk ({self.bwd_chunk}) and bwd_cols ({self.bwd_cols}) name two different "
                             "backwards (chunked, split): set one of them, the other 0")


# Interpreter: one parameter program per 1024 columns (each interpreted program costs milliseconds).
_PARAM_COLS = 1024 if INTERPRETED else 32
# default: H above this takes the split backward. At H = 8192 the whole-row backward spills ~120 B a
# thread and still ran 904.6 / 815.1 us net fwd+bwd (sync / stream) against the chunked one's 1538.8 /
# 1317.7 (H200, kernels/NOTES.md v21-v22); at 16384 lanes a row it would spill several times that. Above
# it the split backward (c first, then column blocks of 4096) took ~1120 us of kernels at H = 12288 (dots
# 442, blocks 676) against the chunked backward's 1632 (kernels/NOTES.md v30).
SPLIT_ABOVE = 8192


@functools.lru_cache(maxsize=64)
def launch_config(hidden: int) -> LaunchConfig:
    """The default launch configuration for rows of `hidden` elements (kernels/NOTES.md, v14-v17).

    Registers per thread (sm_90, `python -m tools.compile_norm_modulate`) set the shapes: each kernel
    spill-free with 16-32 KB of loads in flight per SM. Forward: the per-row kernel (v13), at narrow H
    (<= 4096) with the tables kept in L1 and x, y streamed past them (`fwd_l1_tables`, v22: the sorted
    walk forward of v17 measured slower there); above, x read again for y and, under the global plan,
    the plan walk (v33). Backward: whole rows in registers up to H <= 8192, one program per SM (two of
    half the tile up to 4096 lanes a row, v33-v34); split above (v30)."""
    block_h = next_power_of_2(hidden)
    common = dict(block_h=block_h, bwd_programs_per_sm=1, param_cols=_PARAM_COLS)
    if block_h <= 4096:
        # under the global plan too: the plan walk measured slower here (H = 1024, M = 1024: 81.6 us
        # against 42.6; 2048: 91.2 against 74.9; v33)
        rows, warps = row_tile(block_h)
        fwd = dict(fwd_kernel="rows", fwd_rows=rows, fwd_warps=warps, fwd_l1_tables=True)
    else:
        # x read again for y (v33, kernel time on the H200: H = 5376 221 -> 188 us, 8192 311 -> 288, 12288
        # 585 -> 431; the same bits), and the plan walk under the global plan (M = 1024 at 5376: 204 us
        # against the per-row forward's 259; M = 4096 221 against 310; at M = 64 195-198 either way)
        fwd = dict(fwd_kernel="rows", fwd_rows=1, fwd_warps=4 if block_h <= 8192 else 8,  # 16 warps spill at 32768
                   fwd_reload=True, plan_walk_rows=1, plan_walk_warps=8)
    if hidden > SPLIT_ABOVE:
        # [2, 4096] steps on 8 warps (sm_90, triton 3.6: 255 registers, 72 B spilled under the global plan):
        # 1.8-2.4% less kernel time than [4, 2048] (no spill) at H = 12288, M = 9 and 64, in two runs (v30)
        # the first pass's chunks loaded one chunk ahead (the same sums, so the same bits; kernels/NOTES.md
        # v37, v40): H200 kernels per fwd+bwd step at H = 12288, M = 9, two rounds: 1532.2 / 1532.0 us against
        # 1594.8 / 1595.2 (the pass 383 against 445 us), its GPU test bitwise
        bwd = dict(bwd_rows=2, bwd_warps=8, bwd_cols=4096, dots_prefetch=True)
    else:
        rows, warps = whole_row_tile(block_h)
        if block_h <= 4096:
            # two programs an SM, each half the tile on half the warps (v33-v34, H200 kernel time per
            # fwd+bwd step: H = 1024 214 -> 140 us, 2048 278 -> 239, 3072 385 -> 347, 4096 439 -> 433;
            # the backward kernel alone at 3072 257 -> 207 with 32 B spilled; partials 2x: 20 MB at
            # H = 1024, M = 9)
            bwd = dict(bwd_rows=max(1, rows // 2), bwd_warps=max(1, warps // 2), bwd_programs_per_sm=2)
            if block_h <= 2048 and not INTERPRETED:
                # twice the partial rows of one program an SM: 16 columns a parameter program (v35, H200
                # parameter stage at M = 9: H = 1024 18.2 -> 10.6 us, 2048 21.9 -> 16.5, two runs each;
                # at 3072 and 5376 16 columns were slower, 8 slower than 16 at every width)
                bwd["param_cols"] = 16
        else:
            bwd = dict(bwd_rows=rows, bwd_warps=warps)
    return LaunchConfig(**{**common, **fwd, **bwd})


def row_tile(block_h: int) -> tuple[int, int]:
    """(rows, warps) of v13's per-row forward tile: 4K elements a program below 2048 lanes a row, one
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
def _walk_begin(walk, IDX, KEYS, SCRATCH, n_rows, M, CHUNK, CMAX: tl.constexpr, K_P2: tl.constexpr,
                GLOBAL: tl.constexpr):
    """This program's slice lo .. lo + n - 1 of the rows and its segments (module docstring, Plans), and
    the table row just before the slice (global plan; -1 if none).
    Local: SCRATCH[pid*CMAX + j] = the j-th row's offset from lo after the local sort; segment s is
    table row s (M: bad indices), bounds from `starts`/`counts`. Global: the slice is positions of the
    sorted list; SCRATCH[pid*2*(CMAX+2) + s] = where run s starts (n after the last run, twice), and
    CMAX + 2 further on its key clamped to [-1, M] (-1 and M: bad indices), so a segment's bounds and key
    are independent loads. `walk`: the walk's slice, a fused backward's range; None: program_id(0), read
    here as before (read in the caller instead, ptxas scheduled the default launches differently: the same
    reason `_meta` and `_finish` take None for num_programs(0))."""
    if walk is None:
        pid = tl.program_id(0)
    else:
        pid = walk
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
def _fwd_rows_kernel(X, W, SH, SC, IDX, ORDER, KEYS, Y, RSTD, n_rows, M, stride_x, stride_sh, stride_sc, eps,
                     H: tl.constexpr, ROWS: tl.constexpr, HEAD: tl.constexpr, TAIL: tl.constexpr, ORDERED: tl.constexpr,
                     L1_TABLES: tl.constexpr, TABLES_FIRST: tl.constexpr, RELOAD: tl.constexpr,
                     SAVE_RSTD: tl.constexpr, BY_HAND: tl.constexpr):
    """ROWS rows per program (positions of the global plan's list when ORDERED, so programs that run
    together share table rows in L2), w, sh[m], sc[m] gathered per row. A row is a HEAD-wide block (the
    largest power of two <= H: its mask folds away) and a TAIL-wide block for the rest, so H = 5376
    computes on 4096 + 2048 lanes instead of 8192. A bad index makes rstd, so the row, NaN.
    When the loads are issued (same arithmetic, same bits; `LaunchConfig.fwd_tables_first`, `fwd_reload`):
    the tables after the sum of squares (default) or before x's loads (one wait for all of a row's
    loads, more registers held), and x held in registers until y (default) or read again for y."""
    pos = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = pos < n_rows
    if ORDERED:
        # the row and its key side by side from the plan (keys[pos] = idx[order[pos]] clamped to [-1, M]:
        # the same segment), so the tables' loads wait on one load, not on two in a chain (v33)
        rows = tl.load(ORDER + pos, mask=ok, other=0).to(tl.int64)
        seg = segment(tl.load(KEYS + pos, mask=ok, other=0), ok, M)
    else:
        rows = pos.to(tl.int64)
        seg = segment(tl.load(IDX + rows, mask=ok, other=0), ok, M)
    m = tl.minimum(seg, M - 1).to(tl.int64)
    head = tl.arange(0, HEAD)
    if TAIL > 0:
        tail = HEAD + tl.arange(0, TAIL)
    if TABLES_FIRST:
        w_head, sc_head, sh_head = _tables(W, SH, SC, ok, m, head, H, stride_sh, stride_sc, L1_TABLES)
        if TAIL > 0:
            w_tail, sc_tail, sh_tail = _tables(W, SH, SC, ok, m, tail, H, stride_sh, stride_sc, L1_TABLES)
    x_head = _load_tile(X, rows, stride_x, head, ok, H, L1_TABLES).to(tl.float32)
    ss = tl.sum(x_head * x_head, axis=1)
    if TAIL > 0:
        x_tail = _load_tile(X, rows, stride_x, tail, ok, H, L1_TABLES).to(tl.float32)
        ss += tl.sum(x_tail * x_tail, axis=1)
    rstd = 1.0 / tl.sqrt(ss / H + eps)
    rstd = tl.where(seg < M, rstd, float("nan"))
    if not TABLES_FIRST:
        w_head, sc_head, sh_head = _tables(W, SH, SC, ok, m, head, H, stride_sh, stride_sc, L1_TABLES)
    if RELOAD:
        x_head = _x_again(X, rows, stride_x, head, ok, H)
    _modulate(Y, rows, ok, head, x_head, rstd, w_head, sc_head, sh_head, H, L1_TABLES, BY_HAND)
    if TAIL > 0:
        if not TABLES_FIRST:
            w_tail, sc_tail, sh_tail = _tables(W, SH, SC, ok, m, tail, H, stride_sh, stride_sc, L1_TABLES)
        if RELOAD:
            x_tail = _x_again(X, rows, stride_x, tail, ok, H)
        _modulate(Y, rows, ok, tail, x_tail, rstd, w_tail, sc_tail, sh_tail, H, L1_TABLES, BY_HAND)
    if SAVE_RSTD:
        tl.store(RSTD + rows, rstd, mask=ok)


@triton.jit(do_not_specialize=["n_rows", "CHUNK"])
def _fwd_walk_kernel(X, W, SH, SC, IDX, ORDER, KEYS, SCRATCH, Y, RSTD, n_rows, M, stride_x,
                     stride_sh, stride_sc, eps, CHUNK, H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
                     CMAX: tl.constexpr, K_P2: tl.constexpr, GLOBAL: tl.constexpr, SAVE_RSTD: tl.constexpr,
                     BY_HAND: tl.constexpr):
    """This program's rows in segment order, ROWS per step: a[m] and sh[m] loaded once per segment,
    so the only per-row traffic is x and y; the next step's rows are loaded before this step's
    arithmetic (across segment ends too)."""
    pid, lo, n, n_seg, starts, counts, prev_key = _walk_begin(None, IDX, KEYS, SCRATCH, n_rows, M, CHUNK, CMAX, K_P2,
                                                                 GLOBAL)
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
                     CB: tl.constexpr, N_CB: tl.constexpr, G: tl.constexpr, PREFETCH: tl.constexpr):
    """The split backward's first pass: c[r] = sum(dy * a[m] * xhat) / H for G rows a program, in column
    chunks of CB, chunk 0 first (each row's own tl.sum tree per chunk: no other row enters it). A bad
    index has a NaN rstd (the forward's), so its c is NaN. PREFETCH: chunk c + 1's x and dy loaded before
    chunk c's arithmetic (the one past the last masked off: no traffic); the same sums in the same order."""
    rows = tl.program_id(0) * G + tl.arange(0, G)
    ok = rows < n_rows
    key = tl.load(IDX + rows, mask=ok, other=0)
    tl.store(C + rows, _row_dots(X, DY, W, SC, RSTD, rows, ok, key, M, stride_x, stride_dy, stride_sc, H, CB, N_CB, G,
                                 PREFETCH), mask=ok)


@triton.jit
def _row_dots(X, DY, W, SC, RSTD, rows, ok, key, M, stride_x, stride_dy, stride_sc, H: tl.constexpr,
              CB: tl.constexpr, N_CB: tl.constexpr, G: tl.constexpr, PREFETCH: tl.constexpr):
    """c of G rows (their table rows `key`): sum(dy * a[m] * xhat) / H in column chunks of CB, chunk 0 first,
    each row's own tl.sum tree a chunk (the split backward's first pass and the fused backward's producers)."""
    m = tl.minimum(tl.maximum(key, 0), M - 1).to(tl.int64)
    rstd = tl.load(RSTD + rows, mask=ok, other=0.0)
    chunk = tl.arange(0, CB)
    dot = tl.zeros((G,), dtype=tl.float32)
    x_next, dy_next = _prefetched(X, DY, rows, stride_x, stride_dy, chunk, ok, H, PREFETCH)
    for c in range(0, N_CB):
        cols = c * CB + chunk
        col_ok = cols < H
        x, dy, x_next, dy_next = _chunk_tiles(X, DY, rows, stride_x, stride_dy, cols, ok, x_next, dy_next, H, CB,
                                              PREFETCH)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        sc = tl.load(SC + m[:, None] * stride_sc + cols[None, :], mask=ok[:, None] & col_ok[None, :],
                     other=0.0).to(tl.float32)
        dot += tl.sum((dy * (w[None, :] * (1.0 + sc))) * (x * rstd[:, None]), axis=1)
    return dot / H


@triton.jit
def _rows_of(M, GLOBAL: tl.constexpr):
    """Where a program's partial block keeps (its dw row, its workspace's first row), in rows of H."""
    if GLOBAL:
        w_row = M * 0 + 4
    else:
        w_row = 2 * M
    return w_row, w_row + 1


@triton.jit
def _meta(SCRATCH, CMAX: tl.constexpr, n_programs):
    """The keys of the programs' partial slots, [2, programs] int32 after the walk lists (`n_programs`: the
    walks, a fused backward's ranges; None: the launch's programs)."""
    if n_programs is None:
        return SCRATCH + tl.num_programs(0) * 2 * (CMAX + 2)
    else:
        return SCRATCH + n_programs * 2 * (CMAX + 2)


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
def _finish(META, KEYS, DSH, DSC, pid, n_programs, lo, n, n_rows, n_seg, first, before, last, beyond, M, cols,
            col_ok, stride_dsh, stride_dsc, GLOBAL: tl.constexpr):
    """Global plan, after the walk: the keys of this program's partial slots (-1: none) for the combine,
    and, in the last program, zeros for the table rows after the last used one."""
    if GLOBAL:
        first_ok = (first >= 0) & (first < M)
        last_ok = (last >= 0) & (last < M)
        slot1 = beyond & last_ok & ((before & (n_seg == 1)) == 0)
        tl.store(META + pid, tl.where(before & first_ok, first, -1).to(tl.int32))
        if n_programs is None:
            tl.store(META + tl.num_programs(0) + pid, tl.where(slot1, last, -1).to(tl.int32))
        else:
            tl.store(META + n_programs + pid, tl.where(slot1, last, -1).to(tl.int32))
        end = lo + n == n_rows
        z0 = tl.where(end, tl.maximum(tl.minimum(last + 1, M), 0), 0)
        z1 = tl.where(end, M, 0)
        _zero_rows(DSH, DSC, z0, z1, cols, col_ok, stride_dsh, stride_dsc)


@triton.jit(do_not_specialize=["n_rows", "CHUNK"])
def _bwd_kernel(X, DY, DX, W, SC, RSTD, IDX, ORDER, KEYS, SCRATCH, PART, DSH, DSC, C, PROG, n_rows, M,
                stride_x, stride_dy, stride_dx, stride_sc, stride_dsh, stride_dsc, CHUNK, PSTRIDE,
                H: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, CMAX: tl.constexpr, K_P2: tl.constexpr,
                GLOBAL: tl.constexpr, PARAMS: tl.constexpr, COLS: tl.constexpr, BY_HAND: tl.constexpr,
                FUSED: tl.constexpr = False, DOTS_G: tl.constexpr = 1, DOTS_CB: tl.constexpr = 1,
                DOTS_PREFETCH: tl.constexpr = False, PRODUCERS: tl.constexpr = 1, BLOCK_DOTS: tl.constexpr = False,
                EXCHANGE: tl.constexpr = False, AHEAD: tl.constexpr = False, NB_P2: tl.constexpr = 1):
    """Whole rows in registers: this program's rows in segment order, ROWS per step, the next step's x and
    dy loaded before this step's arithmetic (across segment ends too: 1.5x over loading in turn,
    kernels/NOTES.md v5); D, S and the dw partial in fp32 registers. COLS (the split backward): columns
    [program_id(1) * BLOCK_H, + BLOCK_H) of the rows only, with c from C (`_bwd_dots_kernel`), and the next
    step's rstd and c loaded with its x and dy (a block's step moves few bytes: no load may wait in turn);
    every block's program makes the same walk lists (the same values written to the same scratch words,
    each program reading back its own writes).
    FUSED (with COLS; kernels/NOTES.md v39): the first pass in the same launch, a 1-D grid of P ranges x
    (PRODUCERS + NB) programs whose roles come from a ticket (PROG[0], taken as each program starts): the
    first P * PRODUCERS tickets are producers, ticket p * PRODUCERS + j computing c for range p's steps j,
    j + PRODUCERS, ... of DOTS_G positions in the walk's order (`_row_dots`) and publishing after each where
    its next step starts (PROG[1 + ticket], release: its positions below are done); ticket
    P * PRODUCERS + p * NB + b is column block b of range p, which waits (acquire) until every producer of
    its range has passed its next step's positions before loading their c. Producers never wait and start
    before any consumer, so the waits end; under the interpreter the programs run in ticket order,
    producers first.
    BLOCK_DOTS (with COLS, `split_dots` other than "pass"; kernels/NOTES.md v41): no first pass. A 1-D grid of
    P ranges x NB column blocks, block fastest (a range's programs start together); each step's c is the sum,
    block 0 first, of the NB blocks' partial dots (`_block_dots`). EXCHANGE: each program makes its own
    block's partial, posts it (C: [NB, R] fp32), adds one to its range's count (PROG[1 + p], acq_rel) and
    waits (acquire) until the count says every block of its range has posted the same step; roles from a ticket as
    FUSED, so a range's programs wait only on programs that have started, and every wait ends while NB
    programs fit on the GPU at once. Without EXCHANGE each program makes every block's partial itself (the
    same function of the same tiles: the same bits), from the whole rows, which its range's other programs
    read at about the same time (L2). AHEAD (`dots_ahead`): a step's dx is made one step late, after the
    next step's partials are posted, so the partials it waits for were posted a step ago (the count as last
    seen is kept: no look at all when it already sufficed); a segment's last step after its walk."""
    if FUSED:
        NB: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H   # column blocks a range
        ticket = tl.atomic_add(PROG, 1, sem="relaxed", scope="gpu")
        n_ranges = tl.num_programs(0) // (PRODUCERS + NB)
        producer = ticket < n_ranges * PRODUCERS
        consumer = ticket - n_ranges * PRODUCERS
        walk = tl.where(producer, ticket // PRODUCERS, consumer // NB)
        block = tl.where(producer, 0, consumer % NB)
    elif BLOCK_DOTS:
        NB: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
        producer: tl.constexpr = False
        if EXCHANGE:
            ticket = tl.atomic_add(PROG, 1, sem="relaxed", scope="gpu")
        else:
            ticket = tl.program_id(0)
        n_ranges = tl.num_programs(0) // NB
        walk = ticket // NB
        block = ticket % NB
    else:
        producer: tl.constexpr = False
        n_ranges = None  # `_meta` and `_finish` read num_programs(0)
        walk = None  # `_walk_begin` reads program_id(0)
        block = 0  # not read: the split grid's second axis gives the column block
    pid, lo, n, n_seg, starts, counts, prev_key = _walk_begin(walk, IDX, KEYS, SCRATCH, n_rows, M, CHUNK, CMAX, K_P2,
                                                                 GLOBAL)
    if producer:
        _produce_dots(X, DY, W, SC, RSTD, IDX, ORDER, KEYS, SCRATCH, C, PROG, pid, ticket % PRODUCERS, lo, n, M,
                      stride_x, stride_dy, stride_sc, H, CMAX, GLOBAL, DOTS_G, DOTS_CB, DOTS_PREFETCH, PRODUCERS)
    else:
        first, before, last, beyond = _plan_edges(KEYS, lo, n, n_rows, M, GLOBAL)
        if COLS:
            if FUSED:
                cols = block * BLOCK_H + tl.arange(0, BLOCK_H)
            elif BLOCK_DOTS:
                cols = block * BLOCK_H + tl.arange(0, BLOCK_H)
            else:
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
            if FUSED:  # (the call guarded, not only its body: its arguments would be made either way)
                _await_dots(PROG, pid, tl.minimum(ROWS, first_end), PRODUCERS)
            if BLOCK_DOTS:
                rstd_next = tl.load(RSTD + r_next, mask=steps < first_end, other=0.0)
                posted = lo * 0  # steps this program has posted (EXCHANGE)
                seen = lo * 0 - 1  # its range's count as last looked at (AHEAD)
            else:
                rstd_next, c_next = _row_scalars(RSTD, C, r_next, steps < first_end, FUSED)
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
            if AHEAD:  # the step held back a step (none at a segment's start)
                held_rows = r_next
                held_ok = steps < 0
                held_x = tl.zeros((ROWS, BLOCK_H), dtype=tl.float32)
                held_dy = held_x
                held_rstd = tl.zeros((ROWS,), dtype=tl.float32)
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
                    if BLOCK_DOTS:
                        rstd = rstd_next
                        rstd_next = tl.load(RSTD + r_next, mask=n0 + steps < n1, other=0.0)
                        posted += 1
                        if AHEAD:
                            # this step's partials posted, then the step held back finished: the other blocks
                            # posted its partials a step ago, so the count is rarely short
                            if EXCHANGE:
                                _post_partial(C, PROG, x, dy, a, rstd, rows, ok, n_rows, pid, block,
                                              (H + BLOCK_H - 1) // BLOCK_H, False)
                            rows, ok, x, dy, rstd, held_rows, held_ok, held_x, held_dy, held_rstd = (
                                held_rows, held_ok, held_x, held_dy, held_rstd, rows, ok, x, dy, rstd)
                            c, seen = _partials_sum(X, DY, W, SC, C, PROG, rstd, rows, ok, key, M, n_rows, pid,
                                                    posted - 1, seen, stride_x, stride_dy, stride_sc, H, BLOCK_H,
                                                    EXCHANGE, True, NB_P2)
                        else:
                            c = _block_dots(X, DY, W, SC, C, PROG, x, dy, a, rstd, rows, ok, key, M, n_rows, pid,
                                            block, posted, stride_x, stride_dy, stride_sc, H, BLOCK_H, EXCHANGE)
                    else:
                        rstd, c = rstd_next, c_next
                        if FUSED:
                            _await_dots(PROG, pid, tl.minimum(n0 + ROWS, n1), PRODUCERS)
                        rstd_next, c_next = _row_scalars(RSTD, C, r_next, n0 + steps < n1, FUSED)
                    xhat, dx = _row_grads_given(x, dy, a, rstd, c)
                else:
                    rstd = tl.load(RSTD + rows, mask=ok, other=0.0)
                    xhat, dx = _row_grads(x, dy, a, rstd, H)
                # (inline, not `_store_step`: the default launches' SASS stays as measured)
                tl.store(DX + rows[:, None] * stride_dx + cols[None, :], rounded(dx, DX.dtype.element_ty, BY_HAND),
                         mask=ok[:, None] & col_ok[None, :])
                if PARAMS:
                    acc_d += tl.sum(dy, axis=0)
                    acc_s += tl.sum(dy * xhat, axis=0)
            if AHEAD:  # the segment's last step, held back
                c, seen = _partials_sum(X, DY, W, SC, C, PROG, held_rstd, held_rows, held_ok, key, M, n_rows, pid,
                                        posted, seen, stride_x, stride_dy, stride_sc, H, BLOCK_H, EXCHANGE, True,
                                        NB_P2)
                xhat, dx = _row_grads_given(held_x, held_dy, a, held_rstd, c)
                acc_d, acc_s = _store_step(DX, held_rows, held_ok, cols, col_ok, dx, held_dy, xhat, acc_d, acc_s,
                                           stride_dx, PARAMS, BY_HAND)
            if PARAMS:
                acc_w = _flush(key, s0, s1, n, acc_d, acc_s, acc_w, base, W, SC, DSH, DSC, cols, col_ok, M, H,
                               stride_sc, stride_dsh, stride_dsc, before, beyond, GLOBAL, BY_HAND)
        if PARAMS:
            w_row, _ = _rows_of(M, GLOBAL)
            tl.store(base + w_row * H + cols, acc_w, mask=col_ok)
            _finish(_meta(SCRATCH, CMAX, n_ranges), KEYS, DSH, DSC, pid, n_ranges, lo, n, n_rows, n_seg, first, before,
                    last, beyond, M, cols, col_ok, stride_dsh, stride_dsc, GLOBAL)


@triton.jit
def _store_step(DX, rows, ok, cols, col_ok, dx, dy, xhat, acc_d, acc_s, stride_dx, PARAMS: tl.constexpr,
                BY_HAND: tl.constexpr):
    """A step's dx stored (rounded once), and its rows' D and S added (one tl.sum over the step's rows)."""
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], rounded(dx, DX.dtype.element_ty, BY_HAND),
             mask=ok[:, None] & col_ok[None, :])
    if PARAMS:
        acc_d += tl.sum(dy, axis=0)
        acc_s += tl.sum(dy * xhat, axis=0)
    return acc_d, acc_s


@triton.jit
def _produce_dots(X, DY, W, SC, RSTD, IDX, ORDER, KEYS, SCRATCH, C, PROG, pid, j, lo, n, M, stride_x, stride_dy,
                  stride_sc, H: tl.constexpr, CMAX: tl.constexpr, GLOBAL: tl.constexpr, G: tl.constexpr,
                  CB: tl.constexpr, PREFETCH: tl.constexpr, PRODUCERS: tl.constexpr):
    """The fused backward's producer j of range `pid`: c of the range's steps j, j + PRODUCERS, ... of G
    positions in the walk's order, after each (every thread's c stored first) where its next step starts."""
    for q in range(j * G, n, G * PRODUCERS):
        pos = q + tl.arange(0, G)
        ok = pos < n
        rows = _rows_at(pos, ok, lo, ORDER, SCRATCH, pid, CMAX, GLOBAL)
        if GLOBAL:
            key = tl.load(KEYS + lo + pos, mask=ok, other=0)
        else:
            key = tl.load(IDX + rows, mask=ok, other=0)
        tl.store(C + rows, _row_dots(X, DY, W, SC, RSTD, rows, ok, key, M, stride_x, stride_dy, stride_sc, H, CB,
                                     (H + CB - 1) // CB, G, PREFETCH), mask=ok)
        tl.debug_barrier()  # every thread's c is written before the count says so
        tl.atomic_xchg(PROG + 1 + pid * PRODUCERS + j, tl.minimum(q + G * PRODUCERS, n), sem="release", scope="gpu")
    if PRODUCERS > 1:  # a producer whose first step is past the range's end has none: it is done all the same
        tl.atomic_xchg(PROG + 1 + pid * PRODUCERS + j, n, sem="release", scope="gpu")


@triton.jit
def _await_dots(PROG, pid, need, PRODUCERS: tl.constexpr):
    """The fused backward: wait until every producer of range `pid` has published c of its positions below
    `need` (its next step starts at or past `need`, or it is done)."""
    for j in tl.static_range(PRODUCERS):
        done = tl.atomic_add(PROG + 1 + pid * PRODUCERS + j, 0, sem="acquire", scope="gpu")
        while done < need:
            done = tl.atomic_add(PROG + 1 + pid * PRODUCERS + j, 0, sem="acquire", scope="gpu")


@triton.jit
def _block_dots(X, DY, W, SC, XCH, PROG, x, dy, a, rstd, rows, ok, key, M, n_rows, pid, block, posted, stride_x,
                stride_dy, stride_sc, H: tl.constexpr, BLOCK_H: tl.constexpr, EXCHANGE: tl.constexpr):
    """c of a step's rows from the NB column blocks' partial dots sum(dy * a * xhat) over each block's columns
    (a [ROWS, BLOCK_H] tile's tl.sum over axis 1), added block 0 first, over H. EXCHANGE: this program's
    block from its tiles (x, dy, a), posted (`_post_partial`), the others' read back once every block of
    range `pid` has posted its step `posted` (counting from 1; the range's programs walk the same steps). The
    post's own result is the first look, so the last block to post never polls. Else every block's partial
    made here (`_partials_sum`)."""
    if EXCHANGE:
        seen = _post_partial(XCH, PROG, x, dy, a, rstd, rows, ok, n_rows, pid, block, 1, True)
    else:
        seen = posted
    c, _ = _partials_sum(X, DY, W, SC, XCH, PROG, rstd, rows, ok, key, M, n_rows, pid, posted, seen, stride_x,
                         stride_dy, stride_sc, H, BLOCK_H, EXCHANGE)
    return c


@triton.jit
def _post_partial(XCH, PROG, x, dy, a, rstd, rows, ok, n_rows, pid, block, NB: tl.constexpr, LOOK: tl.constexpr):
    """EXCHANGE: this block's partial dots of a step's rows to XCH[block, rows], then counted. LOOK (the
    plain exchange): one count a range, PROG[1 + pid], NB posts a step: it reaches NB * k only when every
    block has posted its step k, since no block posts step k + 1 before all have posted step k (so no later
    post stands in for a missing one); the post is also the first look (acq_rel; returns the count after
    it). Else (a step ahead, where a block may post k + 1 while another has posted only k - 1, so a sum
    could be fooled): a count a block, PROG[1 + pid * NB + block], a release add whose result nobody waits
    for (returns -1)."""
    tl.store(XCH + block * n_rows + rows, tl.sum((dy * a) * (x * rstd[:, None]), axis=1), mask=ok)
    tl.debug_barrier()  # every thread's partial is written before the count says so
    if LOOK:
        seen = tl.atomic_add(PROG + 1 + pid, 1, sem="acq_rel", scope="gpu") + 1
    else:
        tl.atomic_add(PROG + 1 + pid * NB + block, 1, sem="release", scope="gpu")
        seen = pid * 0 - 1
    return seen


@triton.jit
def _partials_sum(X, DY, W, SC, XCH, PROG, rstd, rows, ok, key, M, n_rows, pid, step, seen, stride_x, stride_dy,
                  stride_sc, H: tl.constexpr, BLOCK_H: tl.constexpr, EXCHANGE: tl.constexpr,
                  PER_BLOCK: tl.constexpr = False, NB_P2: tl.constexpr = 1):
    """(c of step `step`'s rows (counting from 1): the NB blocks' partials added block 0 first, over H; the
    count last seen). EXCHANGE: read back (past L1) once the counts (`_post_partial`) say every block of
    range `pid` has posted step `step`: the range's count reaching NB * step, or (PER_BLOCK) the least of
    the blocks' counts reaching `step`, all NB looked at in one go (acquire). `seen`, the count as last
    looked at, is looked at again only while short. Else each block's partial made here from x and dy
    loaded again (the same function of the same tiles as a post's, so the same bits)."""
    NB: tl.constexpr = (H + BLOCK_H - 1) // BLOCK_H
    dot = tl.zeros(rstd.shape, dtype=tl.float32)
    if EXCHANGE:
        if PER_BLOCK:
            lanes = tl.arange(0, NB_P2)
            while seen < step:
                counts = tl.atomic_add(PROG + 1 + pid * NB + lanes, 0, mask=lanes < NB, sem="acquire", scope="gpu")
                seen = tl.min(tl.where(lanes < NB, counts, 1 << 30), axis=0)
        else:
            while seen < NB * step:
                seen = tl.atomic_add(PROG + 1 + pid, 0, sem="acquire", scope="gpu")
        for b in tl.static_range(NB):
            dot += tl.load(XCH + b * n_rows + rows, mask=ok, other=0.0, cache_modifier=".cg")
    else:
        for b in tl.static_range(NB):
            cols = b * BLOCK_H + tl.arange(0, BLOCK_H)
            xb = _load_tile(X, rows, stride_x, cols, ok, H, False).to(tl.float32)
            dyb = _load_tile(DY, rows, stride_dy, cols, ok, H, False).to(tl.float32)
            ab = _scale(W, SC, key, M, cols, cols < H, stride_sc)[None, :]
            dot += tl.sum((dyb * ab) * (xb * rstd[:, None]), axis=1)
    return dot / H, seen


@triton.jit
def _row_scalars(RSTD, C, rows, ok, FUSED: tl.constexpr):
    """The split backward: rstd and c of a step's rows (zeros where masked off); c read past L1 when another
    program of the launch wrote it (FUSED)."""
    rstd = tl.load(RSTD + rows, mask=ok, other=0.0)
    if FUSED:
        c = tl.load(C + rows, mask=ok, other=0.0, cache_modifier=".cg")
    else:
        c = tl.load(C + rows, mask=ok, other=0.0)
    return rstd, c


@triton.jit
def _prefetched(X, DY, rows, stride_x, stride_dy, cols, ok, H: tl.constexpr, PREFETCH: tl.constexpr):
    """The chunked backward: chunk `cols`'s x and dy tiles, loaded now, when prefetching; else placeholders
    (each chunk then loads its own in `_chunk_tiles`)."""
    if PREFETCH:
        return _load_tile(X, rows, stride_x, cols, ok, H, False), _load_tile(DY, rows, stride_dy, cols, ok, H, False)
    else:
        return 0.0, 0.0


@triton.jit
def _chunk_tiles(X, DY, rows, stride_x, stride_dy, cols, ok, x_next, dy_next, H: tl.constexpr, CB: tl.constexpr,
                 PREFETCH: tl.constexpr):
    """Chunk `cols`'s x and dy in fp32, and the next chunk's tiles (prefetching: loaded now, the one past
    the last chunk masked off; else the placeholders as given)."""
    if PREFETCH:
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        x_next, dy_next = _prefetched(X, DY, rows, stride_x, stride_dy, cols + CB, ok, H, PREFETCH)
    else:
        x = _load_tile(X, rows, stride_x, cols, ok, H, False).to(tl.float32)
        dy = _load_tile(DY, rows, stride_dy, cols, ok, H, False).to(tl.float32)
    return x, dy, x_next, dy_next


@triton.jit(do_not_specialize=["n_rows", "CHUNK"])
def _bwd_chunked_kernel(X, DY, DX, W, SC, RSTD, IDX, ORDER, KEYS, SCRATCH, PART, DSH, DSC, n_rows,
                        M, stride_x, stride_dy, stride_dx, stride_sc, stride_dsh, stride_dsc, CHUNK, PSTRIDE,
                        H: tl.constexpr, CB: tl.constexpr, N_CB: tl.constexpr, G: tl.constexpr, CMAX: tl.constexpr,
                        K_P2: tl.constexpr, GLOBAL: tl.constexpr, PARAMS: tl.constexpr, PREFETCH: tl.constexpr,
                        BY_HAND: tl.constexpr):
    """Wide rows: G rows of a segment at a time, in column chunks of CB. Pass 1 reads each chunk of x and
    dy for the rows' dot products (c, chunk 0 first); pass 2 reads them again (L2: the group was just
    read) for dx, adding the group's tl.sum of dy and dy * xhat into this program's fp32 workspace
    (rows WD, WS of its partial block: read, add, write back, G rows at a time). The dw partial row
    is built in place. Partial layout as `_bwd_kernel`'s plus the two workspace rows. PREFETCH: both passes
    load chunk c + 1's x and dy before chunk c's arithmetic (the last prefetch is masked off: no traffic),
    so a load is in flight while the previous chunk is summed; the same sums in the same order."""
    pid, lo, n, n_seg, starts, counts, prev_key = _walk_begin(None, IDX, KEYS, SCRATCH, n_rows, M, CHUNK, CMAX, K_P2,
                                                                 GLOBAL)
    first, before, last, beyond = _plan_edges(KEYS, lo, n, n_rows, M, GLOBAL)
    steps = tl.arange(0, G)
    chunk = tl.arange(0, CB)
    if PARAMS:  # without parameter gradients PART, DSH and DSC are None
        base = PART + pid.to(tl.int64) * PSTRIDE
        w_at, ws_at = _rows_of(M, GLOBAL)
        w_row = base + w_at * H
        ws_d = base + ws_at * H
        ws_s = ws_d + H
        for c in range(0, N_CB):
            cols = c * CB + chunk
            tl.store(w_row + cols, tl.zeros((CB,), dtype=tl.float32), mask=cols < H)
    for s in range(0, n_seg):
        key, s0, s1, after = _segment(s, lo, n, starts, counts, KEYS, SCRATCH, pid, CMAX, K_P2, GLOBAL)
        if PARAMS:
            if GLOBAL:
                for c in range(0, N_CB):
                    cols = c * CB + chunk
                    _zero_gap(DSH, DSC, prev_key, key, M, cols, cols < H, stride_dsh, stride_dsc)
                prev_key = key
        for start in range(s0, s1, G):
            # The workspace is read back by other threads than those that wrote it (the loaded vector
            # and the tl.sum result need not share a layout): a barrier orders the previous group's stores.
            tl.debug_barrier()
            ok = start + steps < s1
            rows = _rows_at(start + steps, ok, lo, ORDER, SCRATCH, pid, CMAX, GLOBAL)
            rstd = tl.load(RSTD + rows, mask=ok, other=0.0)
            dot = tl.zeros((G,), dtype=tl.float32)
            x_next, dy_next = _prefetched(X, DY, rows, stride_x, stride_dy, chunk, ok, H, PREFETCH)
            for c in range(0, N_CB):
                cols = c * CB + chunk
                x, dy, x_next, dy_next = _chunk_tiles(X, DY, rows, stride_x, stride_dy, cols, ok, x_next, dy_next, H,
                                                      CB, PREFETCH)
                a = _scale(W, SC, key, M, cols, cols < H, stride_sc)[None, :]
                dot += tl.sum((dy * a) * (x * rstd[:, None]), axis=1)
            c_row = dot / H
            x_next, dy_next = _prefetched(X, DY, rows, stride_x, stride_dy, chunk, ok, H, PREFETCH)
            for c in range(0, N_CB):
                cols = c * CB + chunk
                col_ok = cols < H
                x, dy, x_next, dy_next = _chunk_tiles(X, DY, rows, stride_x, stride_dy, cols, ok, x_next, dy_next, H,
                                                      CB, PREFETCH)
                a = _scale(W, SC, key, M, cols, col_ok, stride_sc)[None, :]
                xhat = x * rstd[:, None]
                dx = (dy * a - xhat * c_row[:, None]) * rstd[:, None]
                tl.store(DX + rows[:, None] * stride_dx + cols[None, :], rounded(dx, DX.dtype.element_ty, BY_HAND),
                         mask=ok[:, None] & col_ok[None, :])
                if PARAMS:
                    again = cols < tl.where(start > s0, H, 0)  # the segment's first group starts from zero
                    tl.store(ws_d + cols, tl.load(ws_d + cols, mask=again, other=0.0) + tl.sum(dy, axis=0),
                             mask=col_ok)
                    tl.store(ws_s + cols, tl.load(ws_s + cols, mask=again, other=0.0) + tl.sum(dy * xhat, axis=0),
                             mask=col_ok)
        if PARAMS:
            tl.debug_barrier()  # as above: the last group's workspace stores, the dw row's
            for c in range(0, N_CB):
                cols = c * CB + chunk
                col_ok = cols < H
                had = cols < tl.where(s1 > s0, H, 0)  # an empty segment (local plan) has zeros
                d = tl.load(ws_d + cols, mask=had, other=0.0)
                sums = tl.load(ws_s + cols, mask=had, other=0.0)
                acc_w = tl.load(w_row + cols, mask=col_ok, other=0.0)
                acc_w = _flush(key, s0, s1, n, d, sums, acc_w, base, W, SC, DSH, DSC, cols, col_ok, M, H, stride_sc,
                               stride_dsh, stride_dsc, before, beyond, GLOBAL, BY_HAND)
                tl.store(w_row + cols, acc_w, mask=col_ok)
    if PARAMS:
        for c in range(0, N_CB):
            cols = c * CB + chunk
            _finish(_meta(SCRATCH, CMAX, None), KEYS, DSH, DSC, pid, None, lo, n, n_rows, n_seg, first, before, last,
                    beyond, M, cols, cols < H, stride_dsh, stride_dsc, GLOBAL)


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
# The host path is kept short on purpose (kernels/NOTES.md v12, v18): everything that depends on the
# shapes only is computed once per (R, H, M, plan, config, device) and cached (`_fwd_recipe`,
# `_bwd_recipe`); unused pointers are passed as None (a constexpr: no data_ptr() call at launch);
# outputs come from empty_like where it applies (half the host cost of torch.empty here).

def walks_plan(cfg: LaunchConfig) -> bool:
    """Whether the forward walks the global plan when there is one (M > local_max): the walk kernel, or
    the per-row forward's plan walk."""
    return cfg.fwd_kernel == "walk" or cfg.plan_walk_rows > 0


def wants_plan(table_rows: int, hidden: int, table_bytes: int, training: bool, cfg: LaunchConfig) -> bool:
    """The global plan is used when M > local_max: always for a backward; for an inference call when the
    walk forward needs it, or when sh + sc outgrow L2 and the per-row forward takes rows in the plan's
    order (`fwd_ordered`: sorted rows then share table rows in L2)."""
    if table_rows <= cfg.local_max:
        return False
    return training or walks_plan(cfg) or (cfg.fwd_ordered and table_bytes > INFERENCE_SORT_BYTES)


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
    plan_walk = cfg.fwd_kernel == "rows" and global_plan and cfg.plan_walk_rows > 0
    if cfg.fwd_kernel == "rows" and not plan_walk:
        head, tail = _head_tail(hidden)
        meta = dict(H=hidden, ROWS=cfg.fwd_rows, HEAD=head, TAIL=tail, ORDERED=global_plan and cfg.fwd_ordered,
                    L1_TABLES=cfg.fwd_l1_tables, TABLES_FIRST=cfg.fwd_tables_first, RELOAD=cfg.fwd_reload,
                    SAVE_RSTD=save_rstd, BY_HAND=BY_HAND, num_warps=cfg.fwd_warps)
        return _fwd_rows_kernel, (cdiv(rows, cfg.fwd_rows),), meta, 0, 0, object()
    # the walk: the config's own (fwd_kernel "walk") or, under the global plan, the plan walk's shape
    walk_rows, walk_warps = (cfg.plan_walk_rows, cfg.plan_walk_warps) if plan_walk else (cfg.fwd_rows, cfg.fwd_warps)
    programs, chunk, cmax = _geometry(rows, device, cfg.fwd_programs_per_sm, cfg.chunk_limit)
    meta = dict(H=hidden, BLOCK_H=cfg.block_h, ROWS=walk_rows, CMAX=cmax, K_P2=_k_p2(table_rows, global_plan),
                GLOBAL=global_plan, SAVE_RSTD=save_rstd, BY_HAND=BY_HAND, num_warps=walk_warps)
    return _fwd_walk_kernel, (programs,), meta, programs * 2 * (cmax + 2), chunk, object()


def _k_p2(table_rows: int, global_plan: bool) -> int:
    return 2 if global_plan else next_power_of_2(table_rows + 2)


def forward(x2d: torch.Tensor, w: torch.Tensor, sh: torch.Tensor, sc: torch.Tensor, idx: torch.Tensor,
            eps: float, save_rstd: bool = True, config: Optional[LaunchConfig] = None,
            plan: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
            out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(y, rstd) for rows x2d [R, H] (unit inner stride) and idx [R]; rstd is None unless save_rstd.
    `plan`: the global plan (`make_plan`); the walk forward needs one when M > local_max (made here then).
    `out`: y's storage, `torch.empty_like(x2d)` from the caller (a graph replay's fixed output)."""
    rows, hidden = x2d.shape
    y = torch.empty_like(x2d) if out is None else out  # x2d has unit inner stride: y is [R, H] contiguous
    # sizes as int arguments, not a tuple: torch's argument parser takes them ~0.5 us faster (tools/hostcost_cpu.py)
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
    keys, order = plan if plan is not None else (None, None)
    strides = (x2d.stride()[0], sh.stride()[0], sc.stride()[0])
    # The launch's key (kernels.common.launch_keyed): the recipe's token (kernel, grid, constexprs, R, M),
    # the strides (specialized ints), the dtype and 16-byte alignment of every tensor the caller passed;
    # y, rstd and the scratch are fresh allocations here.
    key = (token, strides, tensor_key(x2d), tensor_key(w), tensor_key(sh), tensor_key(sc), tensor_key(idx),
           None if plan is None else (tensor_key(keys), tensor_key(order)))
    if scratch_len:
        scratch = x2d.new_empty(scratch_len, dtype=torch.int32)
        args = (x2d, w, sh, sc, idx, order, keys, scratch, y, rstd, rows, table_rows, *strides, eps, chunk)
    else:
        ordered = meta["ORDERED"]  # the plan's lists only where the kernel reads them (None: no data_ptr())
        args = (x2d, w, sh, sc, idx, order if ordered else None, keys if ordered else None, y, rstd, rows,
                table_rows, *strides, eps)
    launch_keyed(kernel, grid, device, key, args, meta)
    return y, rstd


def backward_split(rows: int, cfg: LaunchConfig, device: torch.device) -> tuple[int, int]:
    """(programs, rows per program) of the backward (`split_rows`)."""
    return split_rows(rows, device, cfg.bwd_programs_per_sm, cfg.chunk_limit)


def partial_rows(table_rows: int, cfg: LaunchConfig, global_plan: bool) -> int:
    """fp32 rows of H per backward program: the bound on partial memory (module docstring)."""
    rows = 5 if global_plan else 2 * table_rows + 1
    return rows + (2 if cfg.bwd_chunk else 0)


def dots_meta(hidden: int, cfg: LaunchConfig) -> dict:
    """`_bwd_dots_kernel`'s constexprs and warps for rows of `hidden` under `cfg`."""
    return dict(H=hidden, CB=cfg.dots_chunk, N_CB=cdiv(hidden, cfg.dots_chunk), G=cfg.dots_rows,
                PREFETCH=cfg.dots_prefetch, num_warps=cfg.dots_warps)


def fused_meta(cfg: LaunchConfig, hidden: int) -> dict:
    """`_bwd_kernel`'s constexprs for a split backward's c made in the same launch: the fused first pass
    (`bwd_fused`) or the column blocks' partial dots (`split_dots`); placeholders otherwise. Under the
    interpreter a launch's programs run one after another, so a range's blocks cannot wait for each other:
    there "exchange" runs as "recompute" where a range has more than one block (the same partials added in
    the same order: the same bits, which the GPU test checks), unless `PROGRAMS_AT_ONCE` says a test's
    executor runs a launch's programs at once (tests/concurrent_grid.py)."""
    meta = dict(FUSED=False, DOTS_G=1, DOTS_CB=1, DOTS_PREFETCH=False, PRODUCERS=1, BLOCK_DOTS=False, EXCHANGE=False,
                AHEAD=False, NB_P2=1)
    if cfg.bwd_fused:
        meta.update(FUSED=True, DOTS_G=cfg.dots_rows, DOTS_CB=cfg.dots_chunk, DOTS_PREFETCH=cfg.dots_prefetch,
                    PRODUCERS=cfg.fused_producers)
    elif cfg.split_dots != "pass":
        blocks = cdiv(hidden, cfg.bwd_cols)
        meta.update(BLOCK_DOTS=True, AHEAD=cfg.dots_ahead, NB_P2=next_power_of_2(blocks),
                    EXCHANGE=cfg.split_dots == "exchange" and not (INTERPRETED and not PROGRAMS_AT_ONCE and blocks > 1))
    return meta


@functools.lru_cache(maxsize=512)
def _bwd_recipe(rows: int, hidden: int, table_rows: int, need_params: bool, cfg: LaunchConfig, device: int) -> tuple:
    """Everything of a backward that depends on the shapes only: (global plan, programs, CHUNK, CMAX,
    partial stride, scratch int32 elements, rows kernel, its grid and constexprs, the split backward's
    first pass (grid, constexprs) or None, (parameter stage kernel, grid, constexprs), token: a fresh
    object per recipe, standing in the launch keys for everything the recipe fixes)."""
    global_plan = table_rows > cfg.local_max
    pstride = partial_rows(table_rows, cfg, global_plan) * hidden
    if max(pstride, table_rows * hidden) >= 2 ** 31:
        raise ValueError(f"tables of {table_rows} rows of {hidden} are too large for this kernel's int32 offsets")
    one_launch = cfg.bwd_fused or cfg.split_dots != "pass"
    if one_launch:  # ranges of (producers +) NB column blocks, about bwd_programs_per_sm programs an SM in all
        where = torch.device("cuda", device) if device >= 0 else torch.device("cpu")
        range_programs = (cfg.fused_producers if cfg.bwd_fused else 0) + cdiv(hidden, cfg.bwd_cols)
        programs, chunk = split_row_chunks(rows, where, cfg.bwd_programs_per_sm, range_programs, cfg.chunk_limit)
        cmax = next_power_of_2(chunk)
    else:
        programs, chunk, cmax = _geometry(rows, device, cfg.bwd_programs_per_sm, cfg.chunk_limit)
    meta = dict(H=hidden, CMAX=cmax, K_P2=_k_p2(table_rows, global_plan), GLOBAL=global_plan, PARAMS=need_params,
                BY_HAND=BY_HAND, num_warps=cfg.bwd_warps)
    dots = None
    grid = (programs,)
    if cfg.bwd_cols:
        kernel = _bwd_kernel
        meta.update(BLOCK_H=cfg.bwd_cols, ROWS=cfg.bwd_rows, COLS=True, **fused_meta(cfg, hidden))
        if one_launch:
            grid = (programs * range_programs,)
        else:
            grid = (programs, cdiv(hidden, cfg.bwd_cols))
            dots = ((cdiv(rows, cfg.dots_rows),), dots_meta(hidden, cfg))
    elif cfg.bwd_chunk:
        kernel = _bwd_chunked_kernel
        meta.update(CB=cfg.bwd_chunk, N_CB=cdiv(hidden, cfg.bwd_chunk), G=cfg.bwd_rows,
                    PREFETCH=cfg.bwd_prefetch)
    else:
        kernel = _bwd_kernel
        meta.update(BLOCK_H=cfg.block_h, ROWS=cfg.bwd_rows, COLS=False, **fused_meta(cfg, hidden))
    if global_plan:
        block_c = cfg.param_cols if INTERPRETED else 128
        params = (_bwd_combine_kernel, (cdiv(hidden, block_c), programs + 1),
                  dict(H=hidden, BLOCK_C=block_c, P_TILE=param_tile(programs, 32), BY_HAND=BY_HAND, num_warps=4))
    else:
        params = (_bwd_params_kernel, (cdiv(hidden, cfg.param_cols), table_rows + 1),
                  dict(H=hidden, BLOCK_C=cfg.param_cols, P_TILE=param_tile(programs, cfg.param_tile),
                       BY_HAND=BY_HAND, num_warps=4))
    scratch_len = programs * 2 * (cmax + 2) + (2 * programs if global_plan else 0)
    return global_plan, programs, chunk, cmax, pstride, scratch_len, kernel, grid, meta, dots, params, object()


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
    # int arguments, not tuples (torch's argument parser: ~0.5 us less each, tools/hostcost_cpu.py).
    dx = x2d.new_empty(rows, hidden)
    cfg = config or launch_config(hidden)
    device = x2d.get_device()
    global_plan, programs, chunk, cmax, pstride, scratch_len, kernel, grid, meta, dots, params, token = _bwd_recipe(
        rows, hidden, table_rows, need_params, cfg, device)
    if global_plan and plan is None:
        plan = make_plan(idx, table_rows)
    keys, order = plan if global_plan else (None, None)
    scratch = x2d.new_empty(scratch_len, dtype=torch.int32)
    if need_params:
        partials = x2d.new_empty(programs * pstride, dtype=torch.float32)  # [programs, pstride], flat
        # Three allocations: views of one buffer measured 2x slower per fwd+bwd on the host (autograd
        # handles views of a shared buffer at a cost; kernels/NOTES.md v18).
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
        args += (c, None)
    elif meta.get("FUSED"):  # c made in the same launch; the tickets and each range's count start at zero
        args += (x2d.new_empty(rows, dtype=torch.float32),
                 x2d.new_zeros(1 + programs * cfg.fused_producers, dtype=torch.int32))
    elif meta.get("EXCHANGE"):  # the blocks' partials [NB, R]; the tickets and the counts start at zero
        blocks = cdiv(hidden, cfg.bwd_cols)   # a count a range, or a step ahead a count a block
        args += (x2d.new_empty(blocks * rows, dtype=torch.float32),
                 x2d.new_zeros(1 + programs * (blocks if cfg.dots_ahead else 1), dtype=torch.int32))
    elif kernel is _bwd_kernel:
        args += (None, None)
    launch_keyed(kernel, grid, device, key,
                 args + (rows, table_rows, in_strides[0], in_strides[1], hidden, in_strides[2], *strides, chunk,
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
