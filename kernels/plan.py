"""The global plan of norm_modulate's row walks: rows sorted stably by table row, in three Triton launches.

    keys, order = make_plan(idx, table_rows)

order lists the rows grouped by table row and ascending within each group, bad indices first (< 0) and
last (>= M) as groups of their own; keys[i] is order[i]'s table row clamped to [-1, M] (int64, both).
For good indices this is torch.sort(idx, stable=True), whose CUDA path is ~25 launches (cub's onesweep
radix sort over 64-bit keys: 8 passes, memsets, copies): on the H200 VM their host time, ~330 us a call
with ~60 us of GPU work, set the pace of a whole fwd+bwd at M = 64 (kernels/NOTES.md v31).

Launches, over blocks of BLOCK rows (P = ceil(R / BLOCK) programs):
1. `_count_kernel`: for each row i of block p, of bucket b (its clamped table row + 1, so 0 .. M + 1):
   its rank among the block's bucket-b rows (those before it) and their count, by comparing the block's
   buckets with each other CHUNK at a time; RANKS[i] = the rank; COUNTS[b, p] = the count, written by
   the bucket's first row (zeros written for every bucket first).
2. `_offsets_kernel` (one program): COUNTS in place to its exclusive prefix sum in bucket-major,
   block-minor order: where block p's rows of bucket b start in the plan.
3. `_place_kernel`: row i goes to position COUNTS[b, p] + RANKS[i].
Integer arithmetic only, no atomics, no sort (tl.sort's bitonic network took seconds a call under the
Triton interpreter): the plan is a function of idx and M. Scratch: RANKS 4 * R bytes, COUNTS
4 * (M + 2) * P bytes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common import cdiv, launch_keyed, tensor_key

BLOCK = 512    # rows per program: each compares its rows' buckets with each other, O(BLOCK^2) per block
CHUNK = 16     # rows compared at a time ([BLOCK, CHUNK] tiles)
SCAN = 4096    # `_offsets_kernel`'s chunk
ZERO = 1024    # `_count_kernel` zeroes its COUNTS column in chunks of this many buckets


@triton.jit
def _buckets(IDX, rows, ok, M):
    """Clamped table row + 1 (0 .. M + 1) of each row; M + 2 for rows past the end (matches no row)."""
    key = tl.load(IDX + rows, mask=ok, other=0).to(tl.int64)
    return tl.where(ok, tl.minimum(tl.maximum(key, -1), M) + 1, M + 2)


@triton.jit(do_not_specialize=["n_rows", "M", "programs"])
def _count_kernel(IDX, RANKS, COUNTS, n_rows, M, programs, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
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
    tl.store(RANKS + rows, rank, mask=ok)
    buckets = M + 2
    for z in range(0, buckets, ZERO):
        b = z + tl.arange(0, ZERO)
        tl.store(COUNTS + b.to(tl.int64) * programs + p, tl.zeros([ZERO], dtype=tl.int32), mask=b < buckets)
    tl.debug_barrier()   # the counts below overwrite zeros other threads wrote
    tl.store(COUNTS + bucket * programs + p, count, mask=ok & (rank == 0))


@triton.jit(do_not_specialize=["n"])
def _offsets_kernel(COUNTS, n, SCAN: tl.constexpr):
    carry = tl.zeros([1], dtype=tl.int32)
    for start in range(0, n, SCAN):
        i = start + tl.arange(0, SCAN)
        v = tl.load(COUNTS + i, mask=i < n, other=0)
        tl.store(COUNTS + i, carry + tl.cumsum(v, 0) - v, mask=i < n)
        carry += tl.sum(v, 0)


@triton.jit(do_not_specialize=["n_rows", "M", "programs"])
def _place_kernel(IDX, RANKS, COUNTS, KEYS, ORDER, n_rows, M, programs, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    rows = p * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n_rows
    bucket = _buckets(IDX, rows, ok, M)
    at = tl.load(COUNTS + bucket * programs + p, mask=ok, other=0) + tl.load(RANKS + rows, mask=ok, other=0)
    tl.store(ORDER + at, rows.to(tl.int64), mask=ok)
    tl.store(KEYS + at, bucket - 1, mask=ok)


def make_plan(idx: torch.Tensor, table_rows: int, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, order) of idx [R] (int32 or int64, contiguous) over `table_rows` table rows (module docstring).
    `block`: rows per program, a power of two >= CHUNK (tests take small ones)."""
    rows = idx.shape[0]
    keys = idx.new_empty(rows, dtype=torch.int64)
    order = idx.new_empty(rows, dtype=torch.int64)
    if rows == 0:
        return keys, order
    programs = cdiv(rows, block)
    buckets = table_rows + 2
    if buckets * programs >= 2 ** 31:
        raise ValueError(f"a plan of {rows} rows over {table_rows} table rows needs more than 2^31 counters")
    ranks = idx.new_empty(rows, dtype=torch.int32)
    counts = idx.new_empty(buckets * programs, dtype=torch.int32)
    device = idx.get_device()
    # keys of the launches (kernels.common.launch_keyed): idx is the only tensor from outside; the ints
    # are not specialized (do_not_specialize), the constexprs are named in the keys
    where = tensor_key(idx)
    meta = dict(BLOCK=block, CHUNK=min(CHUNK, block), ZERO=ZERO, num_warps=4)
    launch_keyed(_count_kernel, (programs,), device, ("plan-count", block, where),
                 (idx, ranks, counts, rows, table_rows, programs), meta)
    launch_keyed(_offsets_kernel, (1,), device, ("plan-offsets",), (counts, buckets * programs),
                 dict(SCAN=SCAN, num_warps=4))
    launch_keyed(_place_kernel, (programs,), device, ("plan-place", block, where),
                 (idx, ranks, counts, keys, order, rows, table_rows, programs), dict(BLOCK=block, num_warps=4))
    return keys, order
