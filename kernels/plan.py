"""The global plan of norm_modulate's row walks: rows sorted stably by table row, in three launches.

    keys, order = make_plan(idx, table_rows)

order lists the rows grouped by table row and ascending within each group, bad indices first (< 0) and
last (>= M) as groups of their own; keys[i] is order[i]'s table row clamped to [-1, M] (int64, both).
For good indices this is torch.sort(idx, stable=True), whose CUDA path is ~25 launches (cub's onesweep
radix sort over 64-bit keys: 8 passes, memsets, copies): their host time, several times their GPU work,
set the pace of a whole fwd+bwd at M = 64 (kernels/notes/norm_modulate.md, "The global plan", has the
figures).

Launches, over blocks of BLOCK rows (P = ceil(R / BLOCK) programs), with bucket b = the clamped table row
+ 1 (0 .. M + 1) and one int32 workspace [RANKS: R | COUNTS: P x (M + 2), block-major | WITHIN: M + 2 |
CHUNK_SUM: ceil((M + 2) / SCAN_BUCKETS)]:
1. `_count_kernel`, one program a block: each row's rank among the block's bucket-b rows before it and
   their count, by comparing the block's buckets with each other CHUNK at a time; RANKS[i] = the rank;
   the block's row of COUNTS zeroed, then (after a barrier) COUNTS[p, b] = the count, written by the
   bucket's first row.
2. `_scan_kernel`, one program per chunk of SCAN_BUCKETS buckets: down each bucket's column, COUNTS[p, b]
   becomes the exclusive sum over blocks p' < p (tiles of SCAN_BLOCKS blocks, left to right); WITHIN[b] =
   the rows of the chunk's buckets before b, CHUNK_SUM[c] = the chunk's rows.
3. `_place_kernel`, one program a block: row i of bucket b (chunk c) goes to position
   sum(CHUNK_SUM[c'] for c' < c) + WITHIN[b] + COUNTS[p, b] + RANKS[i] (the chunk sums PLACE_CHUNKS at a
   time).
Integer arithmetic only, no atomics: the plan is a function of idx and M. BLOCK is 128 unless the
counters (M + 2) * P would pass COUNTERS, then doubled up to MAX_BLOCK; beyond that, or where a place
program's chunk sums (ceil((M + 2) / SCAN_BUCKETS) * BLOCK) would pass PLACE_WORK (M in the millions),
torch's stable sort of the clamped indices makes the same plan. Scratch: 4 * (R + (M + 2) * (P + 1) +
ceil((M + 2) / SCAN_BUCKETS)) bytes (at most ~16 MB of counters). Each launch takes a few us on the H200 at
R = 32768 (kernels/notes/norm_modulate.md has the figures and the command). The other ways
measured (per-block tl.sort, one program's scan, 512-row blocks, torch.cumsum between four launches,
place programs summing every bucket): kernels/notes/norm_modulate.md, "Variants tried and rejected".
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3bench.kernels.common import cdiv, launch_keyed, tensor_key

BLOCK = 128              # rows per program: each compares its rows' buckets with each other
MAX_BLOCK = 4096
COUNTERS = 1 << 22       # at most this many bucket x block counters (16 MB of int32)
PLACE_WORK = 1 << 24     # at most this many scan chunk x row comparisons in one place program
SCAN_BUCKETS, SCAN_BLOCKS = 32, 64   # the scan's [blocks, buckets] tiles: one program per SCAN_BUCKETS
PLACE_CHUNKS = 32        # scan chunks' sums added at a time by a place program
ZERO_CHUNK = 1024        # COUNTS entries a count program zeroes at a time


def _chunk_and_warps(block: int) -> tuple[int, int]:
    """Rows compared at a time ([block, chunk] tiles of ~4K elements) and warps, by block size."""
    return max(1, min(block, 4096 // block)), (4 if block <= 512 else 8)


@triton.jit
def _buckets(IDX, rows, ok, M):
    """Clamped table row + 1 (0 .. M + 1) of each row; M + 2 for rows past the end (matches no row)."""
    key = tl.load(IDX + rows, mask=ok, other=0).to(tl.int64)
    return tl.where(ok, tl.minimum(tl.maximum(key, -1), M) + 1, M + 2).to(tl.int32)


@triton.jit
def _counts_row(WORK, n_rows, M, p):
    """Where block p's row of COUNTS starts in the workspace (p = the block count: WITHIN, then CHUNK_SUM)."""
    return WORK + n_rows + p.to(tl.int64) * (M + 2)


@triton.jit(do_not_specialize=["n_rows", "M", "programs"])
def _count_kernel(IDX, WORK, n_rows, M, programs, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                  ZERO: tl.constexpr):
    p = tl.program_id(0)
    j = tl.arange(0, BLOCK)
    rows = p * BLOCK + j
    ok = rows < n_rows
    bucket = _buckets(IDX, rows, ok, M)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    count = tl.zeros([BLOCK], dtype=tl.int32)
    for c in range(0, BLOCK, CHUNK):
        k = c + tl.arange(0, CHUNK)
        same = bucket[:, None] == _buckets(IDX, p * BLOCK + k, p * BLOCK + k < n_rows, M)[None, :]
        count += tl.sum(same.to(tl.int32), axis=1)
        rank += tl.sum((same & (k[None, :] < j[:, None])).to(tl.int32), axis=1)
    tl.store(WORK + rows, rank, mask=ok)
    counts = _counts_row(WORK, n_rows, M, p)
    for z in range(0, M + 2, ZERO):
        b = z + tl.arange(0, ZERO)
        tl.store(counts + b, tl.zeros([ZERO], dtype=tl.int32), mask=b < M + 2)
    tl.debug_barrier()  # the zeros first: a bucket's count is stored over its zero by another thread
    tl.store(counts + bucket, count, mask=ok & (rank == 0))


@triton.jit(do_not_specialize=["n_rows", "M", "programs"])
def _scan_kernel(WORK, n_rows, M, programs, BUCKETS: tl.constexpr, BLOCKS: tl.constexpr):
    c = tl.program_id(0)
    b = c * BUCKETS + tl.arange(0, BUCKETS)
    b_ok = b < M + 2
    carry = tl.zeros([BUCKETS], dtype=tl.int32)
    for p0 in range(0, programs, BLOCKS):
        p = p0 + tl.arange(0, BLOCKS)
        at = _counts_row(WORK, n_rows, M, p)[:, None] + b[None, :]
        mask = (p < programs)[:, None] & b_ok[None, :]
        tile = tl.load(at, mask=mask, other=0)
        tl.store(at, tl.cumsum(tile, axis=0) - tile + carry[None, :], mask=mask)
        carry += tl.sum(tile, axis=0)
    # carry: each bucket's rows over all blocks; WITHIN[b]: the rows of this chunk's buckets before b
    within = _counts_row(WORK, n_rows, M, programs)
    tl.store(within + b, tl.cumsum(carry, axis=0) - carry, mask=b_ok)
    tl.store(within + M + 2 + c, tl.sum(carry, axis=0))   # CHUNK_SUM[c]


@triton.jit(do_not_specialize=["n_rows", "M", "programs"])
def _place_kernel(IDX, WORK, KEYS, ORDER, n_rows, M, programs, BLOCK: tl.constexpr, SCAN_BUCKETS: tl.constexpr,
                  CHUNKS: tl.constexpr):
    p = tl.program_id(0)
    rows = p * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n_rows
    bucket = _buckets(IDX, rows, ok, M)
    within = _counts_row(WORK, n_rows, M, programs)
    mine = bucket // SCAN_BUCKETS                         # the scan chunk of each row's bucket
    base = tl.load(within + bucket, mask=ok, other=0)     # rows before it in its chunk's buckets
    n_chunks = (M + 2 + SCAN_BUCKETS - 1) // SCAN_BUCKETS
    for c0 in range(0, n_chunks, CHUNKS):                 # + every earlier chunk's rows
        c = c0 + tl.arange(0, CHUNKS)
        sums = tl.load(within + M + 2 + c, mask=c < n_chunks, other=0)
        base += tl.sum(tl.where(c[None, :] < mine[:, None], sums[None, :], 0), axis=1)
    pre = tl.load(_counts_row(WORK, n_rows, M, p) + bucket, mask=ok, other=0)
    at = base + pre + tl.load(WORK + rows, mask=ok, other=0)
    tl.store(ORDER + at, rows.to(tl.int64), mask=ok)
    tl.store(KEYS + at, (bucket - 1).to(tl.int64), mask=ok)


def plan_block(rows: int, table_rows: int) -> int:
    """Rows per program: BLOCK, doubled while the counters would pass COUNTERS; 0: too many even at
    MAX_BLOCK (torch's sort then)."""
    block = BLOCK
    while (table_rows + 2) * cdiv(rows, block) > COUNTERS:
        if block >= MAX_BLOCK:
            return 0
        block *= 2
    return block if cdiv(table_rows + 2, SCAN_BUCKETS) * block <= PLACE_WORK else 0


def make_plan(idx: torch.Tensor, table_rows: int, block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, order) of idx [R] (int32 or int64, contiguous) over `table_rows` table rows (module docstring).
    `block`: rows per program, a power of two (0: `plan_block`'s; tests take small ones)."""
    rows = idx.shape[0]
    block = block or plan_block(rows, table_rows)
    if block == 0 or rows == 0:
        return torch.sort(idx.long().clamp(-1, table_rows), stable=True)
    programs = cdiv(rows, block)
    keys = idx.new_empty(rows, dtype=torch.int64)
    order = idx.new_empty(rows, dtype=torch.int64)
    scan_chunks = cdiv(table_rows + 2, SCAN_BUCKETS)
    work = idx.new_empty(rows + (table_rows + 2) * (programs + 1) + scan_chunks, dtype=torch.int32)
    device = idx.get_device()
    chunk, warps = _chunk_and_warps(block)
    # keys of the launches (kernels.common.launch_keyed): idx is the only tensor from outside; the ints
    # are not specialized (do_not_specialize), the constexprs are named in the keys
    where = tensor_key(idx)
    args = (rows, table_rows, programs)
    launch_keyed(_count_kernel, (programs,), device, ("plan-count", block, where), (idx, work, *args),
                 dict(BLOCK=block, CHUNK=chunk, ZERO=ZERO_CHUNK, num_warps=warps))
    launch_keyed(_scan_kernel, (scan_chunks,), device, ("plan-scan",), (work, *args),
                 dict(BUCKETS=SCAN_BUCKETS, BLOCKS=SCAN_BLOCKS, num_warps=4))
    launch_keyed(_place_kernel, (programs,), device, ("plan-place", block, where), (idx, work, keys, order, *args),
                 dict(BLOCK=block, SCAN_BUCKETS=SCAN_BUCKETS, CHUNKS=PLACE_CHUNKS, num_warps=warps))
    return keys, order
