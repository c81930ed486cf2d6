"""The global plan of norm_modulate's row walks: rows sorted stably by table row, in four launches.

    keys, order = make_plan(idx, table_rows)

order lists the rows grouped by table row and ascending within each group, bad indices first (< 0) and
last (>= M) as groups of their own; keys[i] is order[i]'s table row clamped to [-1, M] (int64, both).
For good indices this is torch.sort(idx, stable=True), whose CUDA path is ~25 launches (cub's onesweep
radix sort over 64-bit keys: 8 passes, memsets, copies): on the H200 VM their host time, ~330 us a call
with ~60 us of GPU work, set the pace of a whole fwd+bwd at M = 64 (kernels/NOTES.md v31).

Launches, over blocks of BLOCK rows (P = ceil(R / BLOCK) programs), on a zeroed COUNTS [M + 2, P]:
1. `_count_kernel`: for each row i of block p, of bucket b (its clamped table row + 1, so 0 .. M + 1):
   its rank among the block's bucket-b rows (those before it) and their count, by comparing the block's
   buckets with each other CHUNK at a time; RANKS[i] = the rank; COUNTS[b, p] = the count, written by
   the bucket's first row.
2. torch.cumsum over COUNTS in bucket-major, block-minor order (one scan kernel): block p's rows of
   bucket b start at CUM[b, p] - COUNTS[b, p] in the plan.
3. `_place_kernel`: row i goes to position CUM[b, p] - COUNTS[b, p] + RANKS[i].
Integer arithmetic only, no atomics: the plan is a function of idx and M. BLOCK is 128 unless the
counters (M + 2) * P would pass COUNTERS, then doubled up to MAX_BLOCK; beyond that (M in the millions)
torch's stable sort of the clamped indices makes the same plan. Scratch: RANKS 4 * R bytes, COUNTS and
CUM 4 * (M + 2) * P bytes each (at most 16 MB each). A first version sorted each block with tl.sort
(2.5 s a call under the interpreter: its bitonic network) and scanned COUNTS in one program (87 us at
M = 4096); with 512-row blocks the comparisons took 176 us (kernels/NOTES.md v31).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common import cdiv, launch_keyed, tensor_key

BLOCK = 128              # rows per program: each compares its rows' buckets with each other
MAX_BLOCK = 4096
COUNTERS = 1 << 22       # at most this many bucket x block counters (16 MB of int32)


def _chunk_and_warps(block: int) -> tuple[int, int]:
    """Rows compared at a time ([block, chunk] tiles of ~4K elements) and warps, by block size."""
    return max(1, min(block, 4096 // block)), (4 if block <= 512 else 8)


@triton.jit
def _buckets(IDX, rows, ok, M):
    """Clamped table row + 1 (0 .. M + 1) of each row; M + 2 for rows past the end (matches no row)."""
    key = tl.load(IDX + rows, mask=ok, other=0).to(tl.int64)
    return tl.where(ok, tl.minimum(tl.maximum(key, -1), M) + 1, M + 2).to(tl.int32)


@triton.jit(do_not_specialize=["n_rows", "M", "programs"])
def _count_kernel(IDX, RANKS, COUNTS, n_rows, M, programs, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
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
    tl.store(RANKS + rows, rank, mask=ok)
    tl.store(COUNTS + bucket.to(tl.int64) * programs + p, count, mask=ok & (rank == 0))


@triton.jit(do_not_specialize=["n_rows", "M", "programs"])
def _place_kernel(IDX, RANKS, COUNTS, CUM, KEYS, ORDER, n_rows, M, programs, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    rows = p * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n_rows
    bucket = _buckets(IDX, rows, ok, M)
    at = bucket.to(tl.int64) * programs + p
    start = tl.load(CUM + at, mask=ok, other=0) - tl.load(COUNTS + at, mask=ok, other=0)
    at = start + tl.load(RANKS + rows, mask=ok, other=0)
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
    return block


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
    ranks = idx.new_empty(rows, dtype=torch.int32)
    counts = idx.new_zeros((table_rows + 2) * programs, dtype=torch.int32)
    device = idx.get_device()
    chunk, warps = _chunk_and_warps(block)
    # keys of the launches (kernels.common.launch_keyed): idx is the only tensor from outside; the ints
    # are not specialized (do_not_specialize), the constexprs are named in the keys
    where = tensor_key(idx)
    launch_keyed(_count_kernel, (programs,), device, ("plan-count", block, where),
                 (idx, ranks, counts, rows, table_rows, programs), dict(BLOCK=block, CHUNK=chunk, num_warps=warps))
    cum = torch.cumsum(counts, 0, dtype=torch.int32)
    launch_keyed(_place_kernel, (programs,), device, ("plan-place", block, where),
                 (idx, ranks, counts, cum, keys, order, rows, table_rows, programs),
                 dict(BLOCK=block, num_warps=warps))
    return keys, order
