"""Batch-invariant GEMM building blocks (timestep_mlp, adaln_projection): one Triton kernel, three uses
(and its TMA-fed twin for 16-bit operands, `tma` below).

    forward      C[m, n]  = epi( sum_k A[m, k] * W[n, k] + bias[n] )               `forward`
    input grad   dX[m, k] = ( sum_n dY[m, n] * W[n, k] ) * silu'(Z[m, k])          `input_grad`
    weight grad  dW[n, k] = sum_t dY[t, n] * A[t, k],   db[n] = sum_t dY[t, n]     `weight_grad`

All three are `_gemm_kernel` on strided views: C[M, N] = A'[M, K] @ B'[K, N] with A' and B' given by
their strides (the forward reads W as B' = W^T, the input gradient W as it is, the weight gradient dY
as A' = dY^T). Epilogue options (on the fp32 accumulator): + bias (fp32), * silu'(Z), silu (storing the
pre-activation too), and one extra column sent to a vector (db, below). Every output is rounded once,
at its store (to nearest even; by hand under the interpreter, `kernels.common.rounded`).

Reduction order (what makes a row's result independent of the batch; change it only with the
invariance checks rerun):

* Each output element is accumulated by one program, over k ascending, in BLOCK_K steps, each step a
  `tl.dot(a, b, acc)` that continues the same fp32 accumulator (never `acc + tl.dot(a, b)`: Triton
  rewrites that into the same form on the GPU, not under the interpreter). The tile config is chosen
  from a fixed table, never by split-K heuristics; no atomics touch values.
* fp32 operands (timestep_mlp) use `input_precision="ieee"`, which Triton lowers without tensor cores
  (AccelerateMatmul rejects fp32 IEEE dots) to its FMA dot: `parametricConvertFMADot` emits, for each
  output element, one chain `acc = fmuladd(a[m, k], b[k, n], acc)` over the tile's k in ascending
  order, starting from the incoming accumulator, and `fmuladd` becomes `fma.rn.f32` under triton's
  default `enable_fp_fusion`. So an element's value is the single fma chain over k = 0 .. K-1 from +0,
  whatever BLOCK_M, BLOCK_N, BLOCK_K or num_warps are: the tile shape decides only which thread runs
  the chain. That is the proof that licenses different fp32 tile configs for different row counts
  (`pick`); `python -m tools.bench_gemm` checks it bitwise on the GPU (rows alone against the same rows
  of T = 2048, each with its own tier's config).
  Zero padding (masked k beyond K) adds fma(0, 0, acc) = acc, exact since a chain started at +0 never
  holds -0.
* bf16 operands (adaln_projection) use wgmma (Hopper's warpgroup MMA, m64nNk16): each step adds the
  16 exact products of a k16 slice to the fp32 accumulator in one instruction. No proof covers two
  different instructions (wgmma against mma.sync, or different k slicing), so every bf16 kernel has
  ONE tile config for all row counts: BLOCK_M >= 64 and num_warps a multiple of 4 keep Triton on wgmma.
  What may change with T is how those tiles are fed and walked (TMA or pointers, persistent, stages,
  grouping: adaln_projection's `HOW_FIELDS`), the same instructions on the same values.
* fp32 operands with `precision="tf32x3"` (LaunchConfig.precision) use the tensor cores: Triton splits
  each operand v into hi = tf32(v) and lo = tf32(v - hi) and takes hi*hi + hi*lo + lo*hi as three
  wgmma's per k8 slice into the same fp32 accumulator (products good to ~2^-22 relative; each slice's
  sum rounded into the accumulator once, a chain 8x shorter than the FMA chain). Like bf16 this has
  no tile-independence proof: such a kernel takes ONE config for every row count.
* fp32 operands with `precision="fp16x3"` use fp16 tensor cores (twice tf32's rate): each operand is
  first scaled by a power of two (exact) so that its largest magnitude lies in [2^13, 2^14) (fp16's
  range: max 65504), then split as hi = fp16(v s), lo = fp16(v s - hi), and each BLOCK_K step adds
  lo*hi, hi*lo, hi*hi (in that order, wgmma k16 slices) into a FRESH tensor-core accumulator, which
  is then added to the fp32 total on the CUDA cores (round to nearest); the total is scaled back
  (exact). Hopper's tensor cores keep fewer bits than fp32 when they carry a long accumulation: the
  same products accumulated across steps in the MMA's accumulator measured ~45x the per-step sum's error
  on the H200 (kernels/notes/gemm.md). The scales: a row of an activation operand gets its own (from that
  row's max|v|: batch-invariant), a weight's rows their own in the forward, and where the scaled axis would
  be the batch (weight gradients) or the reduction, one scale for the whole tensor (`row_maxima` gives the
  maxima; `_pow2_scale` the scale). Magnitudes
  below 2^-24 of the scaled maximum (fp16 subnormals' spacing) lose bits: an absolute error of at most
  ~2^-38 of that maximum per element. One config for every row count, as tf32x3.
  With `local_scales` (LaunchConfig) the scales come from each step's own tiles instead: a row of A's
  [BLOCK_M, BLOCK_K] tile by that row's max over the step's k, a column of B's tile likewise, so no
  maxima pass runs before the GEMM (at small T that pass reads the whole weight once more). The step's
  fresh accumulator is scaled back (two exact power-of-two products) before it is added to the fp32
  total. A row's scales are still its own values' (k blocks fixed by BLOCK_K from k = 0 or the chunk's
  start), so a row's bits stay independent of the batch; a step's maxima are never above the whole
  row's, so each block keeps at least the bits the row-wide scale gave it. `swap_ab` (forward, local
  scales) launches C^T = W A^T instead: W's rows the MMA's M, a few rows of A a narrow N tile (no
  64-row tile padded with zeros at small T); the same scales, products (the two small ones taken back
  in the unswapped order), scale-backs and adds, so each element is the same fp32 expression; the
  tensor core's per-step sum measured bitwise the same whichever operand holds W and whatever the tile
  (H200: every tile, swapped or not, paired or not, alone and as rows of T = 2048; kernels/notes/gemm.md,
  "Reduction order"), which
  lets a forward's tiers swap by row count. `pair_steps` issues two steps' products before either's
  scale-back: the same values added in the same order.
* A persistent config (LaunchConfig.persistent) runs the same per-tile loop for tiles pid, pid + P,
  ... (P programs): which program computes a tile changes, the tile's arithmetic does not.
* `k_major` (input gradients) multiplies a K-contiguous copy of W: the same values in the same order,
  only the memory layout the kernel reads differs.
* `tma` (16-bit operands) launches `_gemm_tma_kernel`: the same tiles, K chunks, steps and epilogues,
  with A and B loaded through TMA descriptors (their bounds give the masked loads' zeros), so only how a
  tile reaches shared memory differs; operands a descriptor cannot read take `_gemm_kernel` with the
  same config.
* Split-K is fixed, never chosen by shape: with SPLIT_K = S > 1 the K range is cut at multiples of
  `k_chunk` (a function of K and S only: ceil(K / S) rounded up to KALIGN, which every BLOCK_K
  divides), each chunk s is accumulated as above from +0 into an fp32 partial P[s], and the last
  program of a tile to finish (an acq_rel atomic counter per tile decides who, not what) adds
  P[0] + P[1] + ... + P[S-1] in that order and runs the epilogue. The order depends on K and S only.
* Weight gradients reduce over the rows: dW's K dimension is T, so dW = dY^T A repeats bitwise run
  to run (one program per output tile, t ascending) but depends on T by nature. db is the extra
  column of the same GEMM: B's column K_a is all ones (in memory for adaln's prepared operand,
  generated in-kernel otherwise), so db[n] is the same t-ascending chain as dW's columns.

Rows beyond M are masked (loaded as 0, never stored); a row only ever meets its own A values and the
shared B tile, so neither its position in the batch nor the batch size reaches its bits.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from h3bench.kernels.common import BY_HAND, INTERPRETED, cdiv, launch, launch_keyed, next_power_of_2, rounded, tensor_key

PRECISIONS = ("ieee", "tf32x3", "fp64", "fp16x3")   # fp32 dots; bf16 is always wgmma
SCALED = "fp16x3"   # the precision whose operands carry power-of-two scales (row maxima)
KALIGN = 128   # split-K chunk boundaries are multiples of this; every BLOCK_K used divides it
_KALIGN = tl.constexpr(KALIGN)


@dataclass(frozen=True)
class LaunchConfig:
    """One tile configuration of `_gemm_kernel`. For bf16 it is part of the reduction order (one
    per kernel for every row count); for fp32 only `split_k` is (see the module docstring)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    split_k: int = 1
    # fp32 only: "ieee" (the FMA chains above) or "tf32x3" (tensor cores: each operand split as
    # hi = tf32(v), lo = tf32(v - hi), and the dot taken as hi*hi + hi*lo + lo*hi in fp32; the products
    # are exact to ~2^-22 relative, the sums fp32). tf32x3 has no tile-independence proof, so a kernel
    # on it takes ONE config for every row count, as bf16 does (`MLPConfigs` enforces it).
    precision: str = "ieee"   # or "fp64": float64 products and sums, one rounding at the store (above)
    # input gradients only: multiply a transposed copy of W (W^T, [K, N]) so both operands are K-contiguous.
    # Hopper's tf32 wgmma reads its shared operands K-major only; an N-contiguous B goes through a
    # transposing shuffle (timestep_mlp's tf32x3 dz1 at T = 2048 took nearly twice as long with W as stored
    # on the H200: kernels/notes/gemm.md). The copy is one read and write of W; no arithmetic changes.
    k_major: bool = False
    # one program per SM slot looping over output tiles (tl.range(..., flatten=True): the next tile's
    # loads are software-pipelined under this tile's epilogue); each tile's arithmetic is unchanged, so
    # the order of every element is the non-persistent one. split_k == 1 only (unless tma).
    persistent: bool = False
    # fp16x3 only: each step's operand scales from that step's own tiles (module docstring), no maxima
    local_scales: bool = False
    # forward only, fp16x3 with local scales: the launch computes C^T = W A^T (W's rows the MMA's M, the
    # rows of A its N), so a few rows of A are a narrow N tile instead of a 64-row M tile padded with
    # zeros. The steps' products, scales and sums are the unswapped launch's, in its order (the two small
    # products and the two scale-backs taken in the unswapped order, `_mainloop`): each output element
    # is the same fp32 expression; that the tensor core sums a step's products the same whichever operand
    # holds W is the hardware's, checked bitwise on the GPU (module docstring). Faster for timestep_mlp's GEMM2
    # at small T than the unswapped 64 x 128 x 32 tiles (kernels/notes/gemm.md has the figures)
    swap_ab: bool = False
    # fp16x3 with local scales: two steps a loop iteration, both split before either's products are issued
    # and their sums added in step order (the same values, products and sums as one step an iteration):
    # one step's MMAs run while the next step's split is made. Taken only where every K chunk has an even
    # number of full steps (`_plan`); elsewhere one step an iteration, the same bits. Faster paired for GEMM2
    # swapped on 64 x 16 x 32 tiles at small T (kernels/notes/gemm.md has the figures)
    pair_steps: bool = False
    # 16-bit operands: A and B through TMA tensor descriptors made in the kernel (`_gemm_tma_kernel`), the
    # same tiles, K chunks, steps and epilogues, so the same bits as without; with `persistent` one program
    # per SM walks the (tile, K chunk) items, split-K included. Operands a descriptor cannot take (no unit
    # stride, a stride or base not 16-byte aligned, fp32) launch the pointer kernel with this config instead
    tma: bool = False
    # with tma and split_k 1: C through a TMA descriptor too, in two column halves staged in shared memory,
    # so a tile's stores run under the next tile's MMAs; the same rounded values (C without a unit column
    # stride or with a row stride not a multiple of 8 elements: the pointer stores)
    tma_store: bool = False

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two, got {v}")
        if self.split_k > 1 and KALIGN % self.block_k:
            raise ValueError(f"with split_k > 1, block_k must divide KALIGN = {KALIGN}, got {self.block_k}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1, got {self.split_k}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision == "fp64" and self.split_k > 1:
            raise ValueError("an fp64 config takes no split-K (its partials would be rounded to fp32)")
        if self.persistent and self.split_k > 1 and not self.tma:
            raise ValueError("a persistent config takes no split-K (unless tma: its items are (tile, K chunk))")
        if self.tma and (self.precision != "ieee" or self.k_major or self.local_scales):
            raise ValueError("tma is a 16-bit operands option: no precision, k_major or local-scale settings")
        if self.tma_store and not (self.tma and self.split_k == 1):
            raise ValueError("tma_store is a tma option without split-K (a split's partials are fp32 sums)")
        sides = (self.block_m, self.block_n, self.block_k)
        if self.tma and (min(sides) < 16 or max(sides) > 256):
            raise ValueError("a tma config's tiles are 16 to 256 on each side (a TMA box and a 16-bit wgmma)")
        if self.precision == SCALED and self.k_major:
            raise ValueError("an fp16x3 config reads its operands as they are (no k_major copies)")
        if self.local_scales and self.precision != SCALED:
            raise ValueError(f"local_scales is an {SCALED} option, got precision {self.precision!r}")
        if self.swap_ab and not self.local_scales:
            raise ValueError(f"swap_ab is an {SCALED} option with local_scales (the order it mirrors)")
        if self.pair_steps and not self.local_scales:
            raise ValueError(f"pair_steps is an {SCALED} option with local_scales (the steps it pairs)")
        if self.swap_ab and self.persistent:
            raise ValueError("swap_ab takes no persistent programs (a small-T launch: one program a tile)")

    def short(self) -> str:
        s = f"{self.block_m}x{self.block_n}x{self.block_k}/w{self.num_warps}/s{self.num_stages}"
        return (s + (f"/k{self.split_k}" if self.split_k > 1 else "")
                + (f"/{self.precision}" if self.precision != "ieee" else "") + ("/P" if self.persistent else "")
                + ("/KM" if self.k_major else "") + ("/L" if self.local_scales else "")
                + ("/S" if self.swap_ab else "") + ("/P2" if self.pair_steps else "")
                + ("/TMA" if self.tma else "") + ("/TS" if self.tma_store else "")
                + (f"/g{self.group_m}" if self.group_m != 8 else ""))


Tiers = Sequence[tuple[int, LaunchConfig]]   # (largest row count, config), ascending; last = the rest


def pick(tiers: Tiers, rows: int) -> LaunchConfig:
    """The config for `rows` rows from tiers (their owner says what may differ between tiers: timestep_mlp's
    MLPConfigs, adaln_projection's ProjectionConfigs)."""
    for limit, cfg in tiers:
        if rows <= limit:
            return cfg
    return tiers[-1][1]


def column_mask_needed(n: int, n_load: int, block_n: int) -> bool:
    """Whether B's column loads need a mask: yes when the grid's column tiles reach past column
    n_load - 1. Not `n_load % block_n != 0`: with the db column N = n_load + 1, so a weight width
    that block_n divides (256, 5376) still gets one more column tile, and an unmasked load there
    reads past the end of B (an illegal address on the H200, first seen in timestep_mlp's dW2)."""
    return cdiv(n, block_n) * block_n > n_load


def k_chunk(k: int, split_k: int) -> int:
    """K elements per split-K chunk: a function of K and the split only (the order of the sum)."""
    if split_k == 1:
        return max(k, 1)
    return cdiv(cdiv(k, split_k), KALIGN) * KALIGN


# --- Triton ------------------------------------------------------------------------------------------

@triton.jit
def _pow2_scale(mx):
    """2^(13 - e) for e the exponent of mx >= 0 (bits, not log2: exact), clamped to fp32's normal
    range: mx * scale lies in [2^13, 2^14) for every normal mx."""
    e = (mx.to(tl.int32, bitcast=True) >> 23) & 0xFF
    se = tl.minimum(tl.maximum(13 - (e - 127) + 127, 1), 254)
    return (se << 23).to(tl.float32, bitcast=True)


@triton.jit
def _pow2_scale_pair(mx):
    """(2^(13 - e), its inverse) for e the exponent of mx >= 0, both normal fp32 (scale exponents clamped to
    [-126, 126]): the per-step scales of `local_scales`, whose inverse multiplies a step's sum back exactly."""
    e = (mx.to(tl.int32, bitcast=True) >> 23) & 0xFF
    se = tl.minimum(tl.maximum(13 - (e - 127) + 127, 1), 253)
    return (se << 23).to(tl.float32, bitcast=True), ((254 - se) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _operand_scale(S, idx, ok, n, ALL: tl.constexpr, BLOCK: tl.constexpr):
    """[BLOCK] scales of an fp16x3 operand: from the maxima S[idx] (a row's own), or with ALL from the
    max of S[0 .. n-1] (one scale for the tensor; max is exact, so any order gives the same bits)."""
    if ALL:
        m = tl.zeros((1024,), tl.float32)
        for i0 in range(0, n, 1024):
            i = i0 + tl.arange(0, 1024)
            m = tl.maximum(m, tl.load(S + i, mask=i < n, other=0.0))
        return tl.zeros((BLOCK,), tl.float32) + _pow2_scale(tl.max(m, 0))
    return _pow2_scale(tl.load(S + idx, mask=ok, other=0.0))


@triton.jit
def _rowmax_kernel(X, Y, OX, OY, rows_x, cols_x, stride_x, rows_y, cols_y, stride_y, ROWS: tl.constexpr,
                   BLOCK: tl.constexpr):
    """OX[r] = max_c |X[r, c]| for the first cdiv(rows_x, ROWS) programs, then OY for Y's rows: two
    tensors' row maxima in one launch."""
    pid = tl.program_id(0)
    x_programs = tl.cdiv(rows_x, ROWS)
    if pid < x_programs:
        src, dst, first, n_rows, n_cols, stride = X, OX, pid * ROWS, rows_x, cols_x, stride_x
    else:
        src, dst, first, n_rows, n_cols, stride = Y, OY, (pid - x_programs) * ROWS, rows_y, cols_y, stride_y
    rows = first + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    m = tl.zeros((ROWS, BLOCK), tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        v = tl.load(src + rows.to(tl.int64)[:, None] * stride + c[None, :],
                    mask=row_ok[:, None] & (c < n_cols)[None, :], other=0.0)
        m = tl.maximum(m, tl.abs(v))
    tl.store(dst + rows, tl.max(m, 1), mask=row_ok)


@triton.jit
def _split_rows(v):
    """(hi, lo, inverse scales) of a tile whose rows each take the power-of-two scale of their own max over
    the tile: a local-scale step's split (`_mainloop` spells the default path's out in its own order)."""
    scale, inverse = _pow2_scale_pair(tl.max(tl.abs(v), 1))
    v = v * scale[:, None]
    hi = v.to(tl.float16)
    return hi, (v - hi.to(tl.float32)).to(tl.float16), inverse


@triton.jit
def _split_cols(v):
    """`_split_rows` for a tile's columns."""
    scale, inverse = _pow2_scale_pair(tl.max(tl.abs(v), 0))
    v = v * scale[None, :]
    hi = v.to(tl.float16)
    return hi, (v - hi.to(tl.float32)).to(tl.float16), inverse


@triton.jit
def _step_products(a_hi, a_lo, b_hi, b_lo, SWAP: tl.constexpr):
    """A step's three products into a fresh accumulator, in `_mainloop`'s order."""
    if SWAP:
        step = tl.dot(a_hi, b_lo)
        step = tl.dot(a_lo, b_hi, step)
    else:
        step = tl.dot(a_lo, b_hi)
        step = tl.dot(a_hi, b_lo, step)
    return tl.dot(a_hi, b_hi, step)


@triton.jit
def _sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def _epilogue(acc, rm, rn, M, n_main, C, BIAS, ZIN, ZOUT, EXTRA, stride_cm, stride_cn, stride_zm, stride_zn,
              stride_om, stride_on, HAS_BIAS: tl.constexpr, MUL_DSILU: tl.constexpr, OUT_SILU: tl.constexpr,
              SAVE_PRE: tl.constexpr, EXTRA_COL: tl.constexpr, BIAS_ROWS: tl.constexpr, BY_HAND: tl.constexpr,
              STORE: tl.constexpr = True):
    """Accumulator -> outputs: bias (per column; BIAS_ROWS, a swapped launch's C^T: per row), silu' or
    silu in the accumulator's type (fp32; float64 for fp64 configs), one rounding per stored value.
    Returns the values C gets before their rounding; without STORE, C (and EXTRA) are the caller's to
    write (`_gemm_tma_kernel`'s descriptor store)."""
    row_ok = rm < M
    col_ok = rn < n_main
    mask = row_ok[:, None] & col_ok[None, :]
    rm64 = rm.to(tl.int64)
    if HAS_BIAS and BIAS_ROWS:
        acc = acc + tl.load(BIAS + rm, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    elif HAS_BIAS:
        acc = acc + tl.load(BIAS + rn, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if MUL_DSILU:
        z = tl.load(ZIN + rm64[:, None] * stride_zm + rn[None, :] * stride_zn, mask=mask, other=0.0).to(tl.float32)
        s = _sigmoid(z)
        acc = acc * (s * (1.0 + z * (1.0 - s)))
    if OUT_SILU:
        if SAVE_PRE:
            tl.store(ZOUT + rm64[:, None] * stride_om + rn[None, :] * stride_on,
                     rounded(acc, ZOUT.dtype.element_ty, BY_HAND), mask=mask)
        acc = acc * _sigmoid(acc)
    if STORE:
        tl.store(C + rm64[:, None] * stride_cm + rn[None, :] * stride_cn, rounded(acc, C.dtype.element_ty, BY_HAND),
                 mask=mask)
        if EXTRA_COL:
            _store_extra_column(acc, rm, rn, M, n_main, EXTRA, BY_HAND)
    return acc


@triton.jit
def _store_extra_column(acc, rm, rn, M, n_main, EXTRA, BY_HAND: tl.constexpr):
    """Column n_main of the product (db) to EXTRA[m]; only the tile holding it stores anything."""
    extra = (rm < M)[:, None] & (rn == n_main)[None, :]
    tl.store(EXTRA + rm.to(tl.int64)[:, None] + 0 * rn[None, :], rounded(acc, EXTRA.dtype.element_ty, BY_HAND),
             mask=extra)


@triton.jit
def _tile_of(tile, M, n_load, num_m, num_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
             MASK_M: tl.constexpr, MASK_N: tl.constexpr):
    """Output tile `tile` -> its rows, columns, row mask and B-column load mask. Tiles go in grouped
    order: GROUP_M row blocks share each column block's B tile while it is in L2. MASK_M is False only
    when M is a weight dimension that BLOCK_M divides (weight_grad); rows of T are always masked, so the
    compiled forward and input-gradient kernels are the same for every T. Without MASK_N (n_load a
    multiple of BLOCK_N: the weights' shape) the column mask folds to true."""
    tile_m, tile_n = _tile_coords(tile, num_m, num_n, GROUP_M)
    rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return rm, rn, (rm < M) | (not MASK_M), (rn < n_load) | (not MASK_N)


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """Output tile `tile` -> its (row block, column block), in grouped order (`_tile_of`)."""
    width = GROUP_M * num_n
    first_m = (tile // width) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % width) % group_size, (tile % width) // group_size


@triton.jit
def _mainloop(A, B, rm, rn, k_lo, k_hi, n_main, row_ok, load_ok, stride_am, stride_ak, stride_bk, stride_bn,
              SA, SB, n_sa, n_sb,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
              PRECISION: tl.constexpr, DOT_F32: tl.constexpr, ONES: tl.constexpr,
              SA_ALL: tl.constexpr, SB_ALL: tl.constexpr, LOCAL: tl.constexpr, SWAP: tl.constexpr,
              PAIR: tl.constexpr, BY_HAND: tl.constexpr):
    """The accumulator of one tile over k in [k_lo, k_hi), ascending, BLOCK_K a step (the order): fp32, or
    float64 for PRECISION "fp64". fp16x3: SA / SB hold the maxima its scales come from (A's rows, B's
    columns; SA_ALL / SB_ALL: one scale from all n_sa / n_sb of them); with LOCAL, each step's tiles.
    PAIR (LOCAL, EVEN_K, an even number of steps in [k_lo, k_hi)): two steps an iteration, both split
    first, then both steps' products, then their scale-backs added in step order."""
    if PRECISION == "fp16x3" and not LOCAL:
        sa = _operand_scale(SA, rm, row_ok, n_sa, SA_ALL, BLOCK_M)
        sb = _operand_scale(SB, rn, load_ok, n_sb, SB_ALL, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_offs = rm.to(tl.int64)[:, None] * stride_am + (k_lo + rk).to(tl.int64)[None, :] * stride_ak
    b_offs = (k_lo + rk).to(tl.int64)[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
    a_ptrs = A + a_offs
    b_ptrs = B + b_offs
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64 if PRECISION == "fp64" else tl.float32)
    if PAIR:
        for _ in range(k_lo, k_hi, 2 * BLOCK_K):
            a0 = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b0 = tl.load(b_ptrs, mask=load_ok[None, :], other=0.0)
            a1 = tl.load(a_ptrs + BLOCK_K * stride_ak, mask=row_ok[:, None], other=0.0)
            b1 = tl.load(b_ptrs + BLOCK_K * stride_bk, mask=load_ok[None, :], other=0.0)
            a0_hi, a0_lo, ia0 = _split_rows(a0)
            b0_hi, b0_lo, ib0 = _split_cols(b0)
            a1_hi, a1_lo, ia1 = _split_rows(a1)
            b1_hi, b1_lo, ib1 = _split_cols(b1)
            step0 = _step_products(a0_hi, a0_lo, b0_hi, b0_lo, SWAP)
            step1 = _step_products(a1_hi, a1_lo, b1_hi, b1_lo, SWAP)
            if SWAP:
                acc += (step0 * ib0[None, :]) * ia0[:, None]
                acc += (step1 * ib1[None, :]) * ia1[:, None]
            else:
                acc += (step0 * ia0[:, None]) * ib0[None, :]
                acc += (step1 * ia1[:, None]) * ib1[None, :]
            a_ptrs += 2 * BLOCK_K * stride_ak
            b_ptrs += 2 * BLOCK_K * stride_bk
    else:
        for k0 in range(k_lo, k_hi, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
                b = tl.load(b_ptrs, mask=load_ok[None, :], other=0.0)
            else:
                k_ok = (k0 + rk) < k_hi
                a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=k_ok[:, None] & load_ok[None, :], other=0.0)
            if ONES:
                if EVEN_K:
                    b = tl.where((rn == n_main)[None, :], 1.0, b).to(b.dtype)
                else:
                    b = tl.where(k_ok[:, None] & (rn == n_main)[None, :], 1.0, b).to(b.dtype)
            if DOT_F32:  # the interpreter's bf16 dot is wrong; bf16 x bf16 products are exact in fp32
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            elif PRECISION == "fp64":
                acc = tl.dot(a.to(tl.float64), b.to(tl.float64), acc, input_precision="ieee", out_dtype=tl.float64)
            elif PRECISION == "fp16x3":
                # spelled out, not `_split_rows` / `_split_cols`: the H200 measurements of this kernel ran
                # this order (a helper's inlining scope can move ptxas's schedule)
                if LOCAL:   # a max rounds nothing: the scales are the step's values' own
                    sa, ia = _pow2_scale_pair(tl.max(tl.abs(a), 1))
                    sb, ib = _pow2_scale_pair(tl.max(tl.abs(b), 0))
                a = a * sa[:, None]   # powers of two: exact
                b = b * sb[None, :]
                a_hi = a.to(tl.float16)
                a_lo = (a - a_hi.to(tl.float32)).to(tl.float16)
                b_hi = b.to(tl.float16)
                b_lo = (b - b_hi.to(tl.float32)).to(tl.float16)
                # a fresh accumulator per step, the small terms first: lo(rows of T) hi(W), hi(rows) lo(W), hi hi;
                # SWAP (A holds W, B the rows of T): the same products in the same order
                step = _step_products(a_hi, a_lo, b_hi, b_lo, SWAP)
                if SWAP:   # exact either way unless a product leaves fp32's normal range: the rows' inverse first
                    acc += (step * ib[None, :]) * ia[:, None]
                elif LOCAL:
                    acc += (step * ia[:, None]) * ib[None, :]   # exact: the inverses are normal powers of two
                else:
                    acc += step
            else:
                acc = tl.dot(a, b, acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    if PRECISION == "fp16x3" and not LOCAL:
        acc = acc * (1.0 / sa)[:, None]   # exact: 1 / 2^j
        acc = acc * (1.0 / sb)[None, :]
    return acc


@triton.jit(do_not_specialize=["M", "K", "chunk", "plane", "n_sa", "n_sb"])
def _gemm_kernel(A, B, C, BIAS, ZIN, ZOUT, EXTRA, PART, COUNTS, SA, SB,
                 M, N, K, n_main, n_load, chunk, plane, n_sa, n_sb,
                 stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                 stride_zm, stride_zn, stride_om, stride_on,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, MASK_M: tl.constexpr, MASK_N: tl.constexpr,
                 PRECISION: tl.constexpr, DOT_F32: tl.constexpr, PERSISTENT: tl.constexpr,
                 ONES: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_DSILU: tl.constexpr,
                 OUT_SILU: tl.constexpr, SAVE_PRE: tl.constexpr, EXTRA_COL: tl.constexpr,
                 SA_ALL: tl.constexpr, SB_ALL: tl.constexpr, LOCAL: tl.constexpr,
                 SWAP: tl.constexpr, PAIR: tl.constexpr, BY_HAND: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of C (or, with SPLIT_K > 1, one K chunk of it; or, PERSISTENT, the
    tiles pid, pid + programs, ...). Columns n_load .. N - 1 of B are not read: with ONES they are ones
    (the db column), else zeros."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    if PERSISTENT:
        for tile in tl.range(pid, num_m * num_n, tl.num_programs(0), flatten=True):
            rm, rn, row_ok, load_ok = _tile_of(tile, M, n_load, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M, MASK_M,
                                               MASK_N)
            acc = _mainloop(A, B, rm, rn, 0, K, n_main, row_ok, load_ok, stride_am, stride_ak, stride_bk, stride_bn,
                            SA, SB, n_sa, n_sb, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, PRECISION, DOT_F32, ONES,
                            SA_ALL, SB_ALL, LOCAL, SWAP, PAIR, BY_HAND)
            _epilogue(acc, rm, rn, M, n_main, C, BIAS, ZIN, ZOUT, EXTRA, stride_cm, stride_cn, stride_zm,
                      stride_zn, stride_om, stride_on, HAS_BIAS, MUL_DSILU, OUT_SILU, SAVE_PRE, EXTRA_COL, SWAP, BY_HAND)
        return
    tile = pid % (num_m * num_n)   # split-major: all tiles of chunk 0 first (its operands share L2)
    split = pid // (num_m * num_n)
    rm, rn, row_ok, load_ok = _tile_of(tile, M, n_load, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M, MASK_M, MASK_N)
    if SPLIT_K == 1:
        k_lo = 0
        k_hi = K
    else:  # chunk is a multiple of KALIGN: saying so keeps the loads vectorized
        k_lo = tl.multiple_of(split * chunk, _KALIGN)
        k_hi = tl.minimum(K, k_lo + chunk)
    acc = _mainloop(A, B, rm, rn, k_lo, k_hi, n_main, row_ok, load_ok, stride_am, stride_ak, stride_bk, stride_bn,
                    SA, SB, n_sa, n_sb, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, PRECISION, DOT_F32, ONES,
                    SA_ALL, SB_ALL, LOCAL, SWAP, PAIR, BY_HAND)

    if SPLIT_K == 1:
        _epilogue(acc, rm, rn, M, n_main, C, BIAS, ZIN, ZOUT, EXTRA, stride_cm, stride_cn, stride_zm, stride_zn,
                  stride_om, stride_on, HAS_BIAS, MUL_DSILU, OUT_SILU, SAVE_PRE, EXTRA_COL, SWAP, BY_HAND)
    else:
        _split_epilogue(acc, tile, split, rm, rn, row_ok, M, N, n_main, plane, C, BIAS, ZIN, ZOUT, EXTRA, PART, COUNTS,
                        stride_cm, stride_cn, stride_zm, stride_zn, stride_om, stride_on, SPLIT_K, HAS_BIAS, MUL_DSILU,
                        OUT_SILU, SAVE_PRE, EXTRA_COL, SWAP, BY_HAND)


@triton.jit
def _split_epilogue(acc, tile, split, rm, rn, row_ok, M, N, n_main, plane, C, BIAS, ZIN, ZOUT, EXTRA, PART, COUNTS,
                    stride_cm, stride_cn, stride_zm, stride_zn, stride_om, stride_on, SPLIT_K: tl.constexpr,
                    HAS_BIAS: tl.constexpr, MUL_DSILU: tl.constexpr, OUT_SILU: tl.constexpr, SAVE_PRE: tl.constexpr,
                    EXTRA_COL: tl.constexpr, BIAS_ROWS: tl.constexpr, BY_HAND: tl.constexpr):
    """K chunk `split` of tile `tile`: its fp32 sum to the partials; the tile's last chunk to finish adds
    all of them in chunk order and runs the epilogue (no atomics on values: the counter only says who)."""
    mask = row_ok[:, None] & (rn < N)[None, :]
    offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
    plane64 = plane.to(tl.int64)
    tl.store(PART + split * plane64 + offs, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is written before the counter says so
    done = tl.atomic_add(COUNTS + tile, 1, sem="acq_rel", scope="gpu")
    if done == SPLIT_K - 1:  # the last chunk of this tile to finish adds them all, in chunk order
        tl.store(COUNTS + tile, 0)   # and leaves the counter as it found it: the next launch reuses it
        total = tl.load(PART + offs, mask=mask, other=0.0, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT_K):
            total += tl.load(PART + s * plane64 + offs, mask=mask, other=0.0, cache_modifier=".cg")
        _epilogue(total, rm, rn, M, n_main, C, BIAS, ZIN, ZOUT, EXTRA, stride_cm, stride_cn, stride_zm,
                  stride_zn, stride_om, stride_on, HAS_BIAS, MUL_DSILU, OUT_SILU, SAVE_PRE, EXTRA_COL, BIAS_ROWS, BY_HAND)


@triton.jit(do_not_specialize=["M", "K", "chunk", "plane"])
def _gemm_tma_kernel(A, B, C, BIAS, ZIN, ZOUT, EXTRA, PART, COUNTS,
                     M, N, K, n_main, n_load, chunk, plane, stride_a, stride_b,
                     stride_cm, stride_cn, stride_zm, stride_zn, stride_om, stride_on,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     SPLIT_K: tl.constexpr, MASK_M: tl.constexpr, A_T: tl.constexpr,
                     B_T: tl.constexpr, DOT_F32: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_DSILU: tl.constexpr,
                     OUT_SILU: tl.constexpr, SAVE_PRE: tl.constexpr, EXTRA_COL: tl.constexpr, C_DESC: tl.constexpr,
                     BY_HAND: tl.constexpr):
    """`_gemm_kernel`'s 16-bit tiles with A and B read through TMA descriptors (`LaunchConfig.tma`): the
    same output, tiles, K chunks and epilogues, and per tile the same dots over k in [k_lo, k_hi),
    ascending, BLOCK_K a step (so each element the same sum in the same order: the pointer kernel's
    bits). The descriptors' bounds do the masking: rows past M, columns past n_load and k past K read
    as zeros, as the pointer kernel's masked loads do; every K chunk is a whole number of steps (`_plan`
    checks), so a chunk's last step never reads the next chunk's k. A [M, K] with unit stride along K, or
    (A_T) along M; B [K, n_load] with unit stride along n, or (B_T) along K. Each program walks the work
    items pid, pid + programs, ... (item = chunk * tiles + tile: all tiles of chunk 0 first); with one
    program per item that is one item. C_DESC (`tma_store`, no split): C written through a descriptor in
    two column halves, its bounds (M rows, n_main columns) the pointer stores' mask."""
    if C_DESC:
        c_desc = tl.make_tensor_descriptor(C, shape=[M, n_main], strides=[stride_cm, 1],
                                           block_shape=[BLOCK_M, BLOCK_N // 2])
    if A_T:
        a_desc = tl.make_tensor_descriptor(A, shape=[K, M], strides=[stride_a, 1], block_shape=[BLOCK_K, BLOCK_M])
    else:
        a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[stride_a, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_T:
        b_desc = tl.make_tensor_descriptor(B, shape=[n_load, K], strides=[stride_b, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(B, shape=[K, n_load], strides=[stride_b, 1], block_shape=[BLOCK_K, BLOCK_N])
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    tiles = num_m * num_n
    for item in tl.range(tl.program_id(0), tiles * SPLIT_K, tl.num_programs(0), flatten=True):
        tile = item % tiles
        split = item // tiles
        tile_m, tile_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        m0 = tile_m * BLOCK_M
        n0 = tile_n * BLOCK_N
        k_lo = split * chunk
        k_hi = tl.minimum(K, k_lo + chunk)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K):
            if A_T:
                a = a_desc.load([k0, m0]).T
            else:
                a = a_desc.load([m0, k0])
            if B_T:
                b = b_desc.load([n0, k0]).T
            else:
                b = b_desc.load([k0, n0])
            if DOT_F32:  # the interpreter's bf16 dot is wrong; bf16 x bf16 products are exact in fp32
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        rm = m0 + tl.arange(0, BLOCK_M)
        rn = n0 + tl.arange(0, BLOCK_N)
        if SPLIT_K == 1:
            if C_DESC:
                out = _epilogue(acc, rm, rn, M, n_main, C, BIAS, ZIN, ZOUT, EXTRA, stride_cm, stride_cn, stride_zm,
                                stride_zn, stride_om, stride_on, HAS_BIAS, MUL_DSILU, OUT_SILU, SAVE_PRE, False, False,
                                BY_HAND, False)
                halves = tl.permute(tl.reshape(out, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
                left, right = tl.split(halves)
                c_desc.store([m0, n0], rounded(left, C.dtype.element_ty, BY_HAND))
                c_desc.store([m0, n0 + BLOCK_N // 2], rounded(right, C.dtype.element_ty, BY_HAND))
            else:
                out = _epilogue(acc, rm, rn, M, n_main, C, BIAS, ZIN, ZOUT, EXTRA, stride_cm, stride_cn, stride_zm,
                                stride_zn, stride_om, stride_on, HAS_BIAS, MUL_DSILU, OUT_SILU, SAVE_PRE, False, False,
                                BY_HAND)
            # the db column's masked stores only in the one column tile that holds it: every other tile of a
            # 128 x 256 weight gradient would issue 128 predicated-off 2-byte stores a thread
            if EXTRA_COL and (n0 <= n_main) and (n_main < n0 + BLOCK_N):
                _store_extra_column(out, rm, rn, M, n_main, EXTRA, BY_HAND)
        else:
            row_ok = (rm < M) | (not MASK_M)
            _split_epilogue(acc, tile, split, rm, rn, row_ok, M, N, n_main, plane, C, BIAS, ZIN, ZOUT, EXTRA, PART,
                            COUNTS, stride_cm, stride_cn, stride_zm, stride_zn, stride_om, stride_on, SPLIT_K,
                            HAS_BIAS, MUL_DSILU, OUT_SILU, SAVE_PRE, EXTRA_COL, False, BY_HAND)


@triton.jit
def _silu_cast_kernel(X, OUT, n_rows, D, stride_x, stride_o, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                      ONES: tl.constexpr, PAD: tl.constexpr, BY_HAND: tl.constexpr):
    """OUT[t, :D] = cast(silu(X[t, :D])) in fp32 then one rounding; with ONES, OUT[t, D] = 1 and
    OUT[t, D+1 : D+PAD] = 0 (the db column of the weight-gradient GEMM and its padding)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row_ok = (rows < n_rows)[:, None]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + rows64 * stride_x + cols[None, :], mask=row_ok & (cols < D)[None, :], other=0.0).to(tl.float32)
    y = x * _sigmoid(x)
    if ONES:
        y = tl.where((cols == D)[None, :], 1.0, y)
        width = D + PAD
    else:
        width = D
    tl.store(OUT + rows64 * stride_o + cols[None, :], rounded(y, OUT.dtype.element_ty, BY_HAND),
             mask=row_ok & (cols < width)[None, :])


@triton.jit(do_not_specialize=["n_rows"])
def _colsum_kernel(X, OUT, n_rows, n_cols, stride_x, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """OUT[c] = sum over rows of X[:, c], in float64, in row blocks of ROWS: each block's sum one fixed
    tl.sum tree, the block sums added in ascending block order from +0 (masked rows add +0), one rounding
    to float32 (OUT). fp32 terms are exact in float64 and T * 2^-53 of rounding stays far under the final
    rounding's 2^-24: the bias gradient's error is that one rounding (the op is memory-bound either way)."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    rows = tl.arange(0, ROWS)
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    for r0 in range(0, n_rows, ROWS):
        r = r0 + rows
        tile = tl.load(X + r.to(tl.int64)[:, None] * stride_x + cols[None, :],
                       mask=(r < n_rows)[:, None] & col_ok[None, :], other=0.0).to(tl.float64)
        acc += tl.sum(tile, axis=0)
    tl.store(OUT + cols, acc.to(tl.float32), mask=col_ok)   # float64 -> float32: one rounding, to nearest even


# --- launchers ---------------------------------------------------------------------------------------

COLSUM_ROWS = 128   # rows per tl.sum tree in `column_sums`: part of the bias gradients' order


def column_sums(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[T, N] (unit inner stride) -> [N]: each column's sum in float64, in blocks of COLSUM_ROWS rows (a
    tl.sum tree per block, blocks in ascending order), rounded once: a bias gradient this way is within
    half an ulp of exact where the ones column of `weight_grad` is a chain of T fp32 roundings."""
    if dtype != torch.float32:  # float64 -> a 16-bit type in one rounding is not what `rounded` does
        raise ValueError(f"column_sums writes float32 sums (the fp32 op's bias gradients), got {dtype}")
    rows, cols = x.shape
    out = torch.empty((cols,), dtype=dtype, device=x.device)
    if not rows:
        return out.zero_()
    if cols:
        block = 64 if not INTERPRETED else next_power_of_2(cols)
        launch(_colsum_kernel, (cdiv(cols, block),), x, out, rows, cols, x.stride(0), ROWS=COLSUM_ROWS,
               BLOCK=block, num_warps=4)
    return out


@dataclass(frozen=True)
class Scales:
    """What an fp16x3 GEMM's operand scales come from: `a` the maxima of A's rows (or, `a_all`, any
    maxima whose max is the whole operand's), `b` of B's columns (or `b_all`)."""
    a: torch.Tensor
    b: torch.Tensor
    a_all: bool = False
    b_all: bool = False


def row_maxima(x: torch.Tensor, y: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """max |row| of x [R, C] (fp32, unit inner stride) as an fp32 [R] tensor, and of y when given: one
    launch for both. Exact (a max rounds nothing): the fp16x3 scales built from them repeat bitwise."""
    outs = []
    grid = 0
    rows_per = 64 if INTERPRETED else 4
    for t in (x, y):
        if t is None:
            outs.append(None)
            continue
        if t.dim() != 2 or t.stride(1) != 1 or t.dtype != torch.float32:
            raise ValueError(f"row_maxima takes fp32 [R, C] with unit inner stride, got {t.dtype} "
                             f"{tuple(t.shape)} strides {t.stride()}")
        outs.append(torch.empty((t.shape[0],), dtype=torch.float32, device=t.device))
        grid += cdiv(t.shape[0], rows_per)
    if grid:
        other = y if y is not None else x
        ints = (x.shape[0], x.shape[1], x.stride(0), y.shape[0] if y is not None else 0, other.shape[1],
                other.stride(0))
        meta = dict(ROWS=rows_per, BLOCK=1024 if not INTERPRETED else 256, num_warps=4)
        key = (_rowmax_kernel, x.device.index, ints, tensor_key(x), tensor_key(other))
        launch_keyed(_rowmax_kernel, (grid,), x.device.index, key,
                     (x, other, outs[0], outs[1] if y is not None else outs[0]) + ints, meta)
    return outs[0], outs[1]


def needs_maxima(cfg: LaunchConfig) -> bool:
    """An fp16x3 config whose scales come from its operands' maxima (`row_maxima`), not from each step."""
    return cfg.precision == SCALED and not cfg.local_scales


def _maxima(t: torch.Tensor, given: Optional[torch.Tensor]) -> torch.Tensor:
    return given if given is not None else row_maxima(t if t.stride(-1) == 1 else t.contiguous())[0]


def _torch_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def tma_scratch_allocator() -> None:
    """A kernel that makes TMA descriptors needs global scratch for them, taken from triton's allocator
    at each launch: set torch's caching allocator there unless the caller has set one of their own. The
    allocator is a context variable (per thread), so this is checked on every tma launch."""
    if INTERPRETED:
        return
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_scratch)


_PROGRAMS: dict = {}
_I32_LIMIT = 1 << 31   # an int argument at or above this is passed as int64: another specialization


def persistent_programs(device: torch.device) -> int:
    """Programs of a persistent launch: one per SM (the tiles the configs use fill one SM's shared
    memory); under the interpreter 3, so the tile loop runs several times in the tests."""
    if INTERPRETED or device.type != "cuda":
        return 3
    count = _PROGRAMS.get(device.index)
    if count is None:
        count = _PROGRAMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return count


# Split-K tile counters, one zeroed int32 buffer per (device, stream), kept: the last program of a tile
# sets its counter back to 0, so every launch finds them zeroed without a fill launch of its own (a
# torch.zeros per call was an allocation and a fill kernel: host time at small T). Launches on one
# stream run in turn, so they never share a counter at the same time; another stream gets its own.
_COUNTERS: dict = {}


def split_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """At least `tiles` zeroed int32 counters for split-K launches on the current stream of `device`."""
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0
    found = _COUNTERS.get((device, stream))
    if found is None or found.numel() < tiles:
        fresh = torch.zeros((max(tiles, 1024),), dtype=torch.int32, device=device)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return fresh   # a graph's zero fill runs at replay, not now: never hand this buffer to eager calls
        found = _COUNTERS[(device, stream)] = fresh
    return found


@dataclass(frozen=True, eq=False)
class _Plan:
    """Everything a `_gemm_kernel` launch takes from the shapes, strides, config and flags (not from the
    tensors' addresses): built once per such combination (`_plan`)."""
    programs: int
    split: int    # programs per tile (the config's split_k)
    num_tiles: int
    ints: tuple   # the kernel's int arguments, in its order
    meta: dict
    swap: bool     # the config's swap_ab: A is the weight, B the rows (`run_forward_plan` passes them so)
    token: object  # the launch key's shape part (`_plan`'s `key`): one object per distinct key, so every T
                   # shares it, hashed by identity
    kernel: object = None   # `_gemm_kernel`, or `_gemm_tma_kernel` for a tma config's plan
    fallback: Optional["_Plan"] = None   # a tma plan's pointer-kernel twin, for operands TMA cannot read


_TOKENS: dict = {}   # a launch key's shape part -> its token


@functools.lru_cache(maxsize=4096)
def _plan(device_index, a_strides, b_strides, c_strides, z_strides, o_strides, M: int, N: int, K: int,
          cfg: LaunchConfig, n_main: int, n_load: int, fp32: bool, flags: tuple, n_sa: int, n_sb: int,
          programs_per_device: int) -> _Plan:
    ones, out_silu, m_fixed, has_bias, has_zin, has_zout, has_extra, sa_all, sb_all = flags
    if cfg.tma:
        pointer_cfg = dataclasses.replace(cfg, tma=False, tma_store=False,
                                          persistent=cfg.persistent and cfg.split_k == 1)
        fallback = _plan(device_index, a_strides, b_strides, c_strides, z_strides, o_strides, M, N, K, pointer_cfg,
                         n_main, n_load, fp32, flags, n_sa, n_sb, programs_per_device)
        layout = _tma_layout(a_strides, b_strides)
        if fp32 or ones or layout is None:
            return fallback
        return _tma_plan(device_index, layout, c_strides, z_strides, o_strides, M, N, K, cfg, n_main, n_load, flags,
                         programs_per_device, fallback)
    split = cfg.split_k
    chunk = k_chunk(K, split)
    even_k = K % cfg.block_k == 0 and (split == 1 or chunk % cfg.block_k == 0)
    pair = cfg.pair_steps and K % (2 * cfg.block_k) == 0 and (split == 1 or chunk % (2 * cfg.block_k) == 0)
    mask_n = column_mask_needed(N, n_load, cfg.block_n)
    mask_m = not (m_fixed and M % cfg.block_m == 0)   # M of T rows: always masked (one kernel for all T)
    num_tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    programs = min(num_tiles, programs_per_device) if cfg.persistent else num_tiles * split
    strides = a_strides + b_strides + c_strides + z_strides + o_strides
    ints = (M, N, K, n_main, n_load, chunk, M * N, n_sa, n_sb) + strides   # the kernel's order
    meta = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SPLIT_K=split,
        EVEN_K=even_k, MASK_M=mask_m, MASK_N=mask_n, PRECISION=cfg.precision if fp32 else "tf32",
        DOT_F32=INTERPRETED and not fp32, PERSISTENT=cfg.persistent,
        ONES=ones, HAS_BIAS=has_bias, MUL_DSILU=has_zin, OUT_SILU=out_silu,
        SAVE_PRE=has_zout, EXTRA_COL=has_extra, SA_ALL=sa_all, SB_ALL=sb_all, LOCAL=cfg.local_scales,
        SWAP=cfg.swap_ab, PAIR=pair, BY_HAND=BY_HAND, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    # The specialization's key (kernels.common.launch_keyed): every int above, the constexprs, and (added
    # at launch) c's dtype and the dtype and 16-byte alignment of each tensor from outside (c, the
    # partials, the counters and the maxima are fresh allocations here or in `row_maxima`, or the
    # counters' aligned cache: aligned, their dtypes fixed). M, K, chunk, plane, n_sa and n_sb are not
    # specialized on (`do_not_specialize`): only whether they fit int32 counts, so one key serves every T.
    unspecialized = (M, K, chunk, M * N, n_sa, n_sb)
    key = (_gemm_kernel, device_index, tuple(sorted(meta.items())), (N, K, n_main, n_load) + strides,
           all(v < _I32_LIMIT for v in unspecialized))
    return _Plan(programs, split, num_tiles, ints, meta, cfg.swap_ab, _TOKENS.setdefault(key, object()),
                 _gemm_kernel)


def _tma_layout(a_strides, b_strides) -> Optional[tuple[bool, int, bool, int]]:
    """(A_T, A's row stride, B_T, B's row stride) of 16-bit operands a TMA descriptor can read: one unit
    stride each (A along K, else along M: A_T; B along N, else along K: B_T) and the other a multiple of
    16 bytes; None when they are not so (the base addresses are checked at launch, `run_plan`)."""
    (am, ak), (bk, bn) = a_strides, b_strides
    if ak == 1 and am % 8 == 0:
        a = (False, am)
    elif am == 1 and ak % 8 == 0:
        a = (True, ak)
    else:
        return None
    if bn == 1 and bk % 8 == 0:
        return a + (False, bk)
    if bk == 1 and bn % 8 == 0:
        return a + (True, bn)
    return None


def _tma_plan(device_index, layout, c_strides, z_strides, o_strides, M: int, N: int, K: int, cfg: LaunchConfig,
              n_main: int, n_load: int, flags: tuple, programs_per_device: int, fallback: _Plan) -> _Plan:
    """`_plan` for a tma config whose operands TMA reads (`_tma_layout`): `_gemm_tma_kernel`'s arguments."""
    _, out_silu, m_fixed, has_bias, has_zin, has_zout, has_extra, _, _ = flags
    a_t, stride_a, b_t, stride_b = layout
    split = cfg.split_k
    chunk = k_chunk(K, split)   # a multiple of KALIGN, which block_k divides: whole steps a chunk
    num_tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    items = num_tiles * split
    programs = min(items, programs_per_device) if cfg.persistent else items
    strides = (stride_a, stride_b) + c_strides + z_strides + o_strides
    ints = (M, N, K, n_main, n_load, chunk, M * N) + strides   # the kernel's order
    meta = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SPLIT_K=split,
        MASK_M=not (m_fixed and M % cfg.block_m == 0), A_T=a_t, B_T=b_t, DOT_F32=INTERPRETED,
        HAS_BIAS=has_bias, MUL_DSILU=has_zin, OUT_SILU=out_silu, SAVE_PRE=has_zout, EXTRA_COL=has_extra,
        C_DESC=cfg.tma_store and c_strides[1] == 1 and c_strides[0] % 8 == 0,   # 16-byte rows for 2- and 4-byte C
        BY_HAND=BY_HAND, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    unspecialized = (M, K, chunk, M * N)   # `do_not_specialize`, as `_plan`'s
    key = (_gemm_tma_kernel, device_index, tuple(sorted(meta.items())), (N, K, n_main, n_load) + strides,
           all(v < _I32_LIMIT for v in unspecialized))
    return _Plan(programs, split, num_tiles, ints, meta, False, _TOKENS.setdefault(key, object()),
                 _gemm_tma_kernel, fallback)


def _gemm(a: torch.Tensor, a_strides: tuple[int, int], b: torch.Tensor, b_strides: tuple[int, int],
          c: torch.Tensor, c_strides: tuple[int, int], M: int, N: int, K: int, cfg: LaunchConfig, *,
          n_main: Optional[int] = None, n_load: Optional[int] = None, bias=None, zin=None, zout=None,
          extra=None, ones=False, out_silu=False, m_fixed: bool = False,
          scales: Optional["Scales"] = None) -> None:
    """Launch `_gemm_kernel` for C[M, N] = A'[M, K] @ B'[K, N] (views given by pointer + strides);
    an fp16x3 config needs `scales`, unless its scales are local (`local_scales`). c, zout and extra
    must be the caller's fresh allocations (16-byte aligned: the launch's key takes them so)."""
    if (cfg.precision == SCALED and not cfg.local_scales) != (scales is not None):
        raise ValueError(f"an {SCALED} config needs its operands' maxima (scales), unless its scales are local; "
                         f"others none: {cfg.short()}")
    if cfg.precision == SCALED and ones:
        raise ValueError(f"an {SCALED} GEMM takes no ones column (its scales are of the operands)")
    if scales is not None and not all(m.dtype == torch.float32 and m.dim() == 1 and m.stride(0) == 1
                                      for m in (scales.a, scales.b)):
        raise ValueError("the maxima of an fp16x3 GEMM are fp32 vectors with unit stride (`row_maxima`'s)")
    plan = _plan_for(c.device, a_strides, b_strides, c_strides, M, N, K, cfg, b.dtype, n_main=n_main, n_load=n_load,
                     bias=bias, zin=zin, zout=zout, extra=extra, ones=ones, out_silu=out_silu,
                     m_fixed=m_fixed, scales=scales)
    run_plan(plan, a, b, c, bias=bias, zin=zin, zout=zout, extra=extra, scales=scales)


def _plan_for(device: torch.device, a_strides, b_strides, c_strides, M: int, N: int, K: int, cfg: LaunchConfig,
              b_dtype: torch.dtype, *, n_main=None, n_load=None, bias=None, zin=None, zout=None, extra=None,
              ones=False, out_silu=False, m_fixed=False, scales=None) -> _Plan:
    """`_plan`'s arguments from `_gemm`'s (the tensors only say which pointers are present and zin's and
    zout's strides; every strides argument a tuple, as `_plan`'s cache keys on them)."""
    return _plan(device.index, a_strides, b_strides, c_strides,
                 (zin.stride(0), zin.stride(1)) if zin is not None else (0, 0),
                 (zout.stride(0), zout.stride(1)) if zout is not None else (0, 0),
                 M, N, K, cfg, N if n_main is None else n_main, N if n_load is None else n_load,
                 b_dtype == torch.float32,
                 (ones, out_silu, m_fixed, bias is not None, zin is not None, zout is not None,
                  extra is not None, scales is not None and scales.a_all, scales is not None and scales.b_all),
                 *((scales.a.numel(), scales.b.numel()) if scales is not None else (0, 0)),
                 persistent_programs(device) if cfg.persistent else 0)


def run_plan(plan: _Plan, a, b, c, *, bias=None, zin=None, zout=None, extra=None, scales=None) -> None:
    """Launch a `_plan` on these tensors (the ones its shape, strides and flags were taken from; split-K
    partials made here, the counters from `split_counters`)."""
    device = c.device
    if plan.fallback is not None and not (a.element_size() == 2 and b.element_size() == 2
                                          and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
                                          and c.data_ptr() % 16 == 0):
        plan = plan.fallback   # a descriptor's base must be 16-byte aligned, its elements the 16-bit ones planned
    dummy = c  # stands in for every pointer a constexpr flag leaves unused (never dereferenced)
    if plan.split > 1:
        part = c.new_empty(plan.split * plan.ints[6], dtype=torch.float32)   # ints[6]: M * N, one plane a chunk
        counts = split_counters(device, plan.num_tiles)
    else:
        part = counts = dummy
    user = (tensor_key(a), tensor_key(b), None if bias is None else tensor_key(bias),
            None if zin is None else tensor_key(zin))
    if scales is None:
        sa = sb = dummy
    else:   # the maxima may be the caller's: their dtype and alignment count too
        sa, sb = scales.a, scales.b
        user += (tensor_key(sa), tensor_key(sb))
    args = (a, b, c, dummy if bias is None else bias, dummy if zin is None else zin,
            dummy if zout is None else zout, dummy if extra is None else extra, part, counts)
    if plan.kernel is _gemm_tma_kernel:
        tma_scratch_allocator()
        args += plan.ints
    else:
        args += (sa, sb) + plan.ints
    launch_keyed(plan.kernel, (plan.programs,), device.index, (plan.token, c.dtype, user), args, plan.meta)


def silu_cast(x: torch.Tensor, dtype: torch.dtype, ones_column: bool = False) -> torch.Tensor:
    """[T, D] fp32 -> [T, D] `dtype` = cast(silu(x)), silu in fp32 and one rounding. With `ones_column`
    the result is a [T, D] view of a [T, W] buffer, W = D + 1 rounded up to 16 elements (rows that
    Triton's specialization sees 16-divisible, so its loads vectorize), whose column D is 1 (the db
    column of the weight-gradient GEMM, `weight_grad(..., a_ones="stored")`) and D+1.. are 0."""
    rows, d = x.shape
    if d > 1 and x.stride(1) != 1:
        x = x.contiguous()   # the kernel reads a row's elements at unit stride
    width = silu_cast_width(d, ones_column)
    pad = width - d
    out = torch.empty((rows, width), dtype=dtype, device=x.device)
    if rows:
        # GPU: 4 x 1024 elements a program; the interpreter steps through programs: as few as possible
        tile_rows, block = (64, next_power_of_2(width)) if INTERPRETED else (4, 1024)
        ints = (rows, d, x.stride(0), out.stride(0))
        meta = dict(ROWS=tile_rows, BLOCK=block, ONES=ones_column, PAD=pad, BY_HAND=BY_HAND, num_warps=4)
        key = (_silu_cast_kernel, out.device.index, ints, tensor_key(x), dtype, ones_column, pad)
        launch_keyed(_silu_cast_kernel, (cdiv(rows, tile_rows), cdiv(width, block)), out.device.index,
                     key, (x, out) + ints, meta)
    return out[:, :d]


def silu_cast_width(d: int, ones_column: bool) -> int:
    """The width of `silu_cast`'s buffer for D = `d` columns."""
    return cdiv(d + 1, 16) * 16 if ones_column else d


def silu_cast_buffer(a: torch.Tensor) -> torch.Tensor:
    """The whole [T, W] buffer of which `silu_cast`'s result `a` is the first D columns (with the ones
    column: what `weight_grad(..., a_ones="stored")` reads beyond them)."""
    width = a.stride(0)
    return a.as_strided((a.shape[0], width), (width, 1))


def run_forward_plan(plan: _Plan, a: torch.Tensor, w: torch.Tensor, y: torch.Tensor, bias=None) -> None:
    """Launch a `forward_plan` as `forward(a, w, bias, ...)` would, into a fresh contiguous y."""
    if plan.swap:
        run_plan(plan, w, a, y, bias=bias)
    else:
        run_plan(plan, a, w, y, bias=bias)


def _forward_only(cfg: LaunchConfig) -> None:
    if cfg.swap_ab:
        raise ValueError(f"swap_ab is a forward option (GEMM2's small-T launch), got it for a gradient: "
                         f"{cfg.short()}")


def _input_grad_only(cfg: LaunchConfig) -> None:
    if cfg.k_major:
        raise ValueError(f"k_major is an input-gradient option (a K-major copy of W), got it elsewhere: {cfg.short()}")


def _refuse_fused_silu(cfg: LaunchConfig, fused: bool) -> None:
    if fused and cfg.swap_ab:
        raise ValueError("a swap_ab config is GEMM2's forward: no fused silu (GEMM1's epilogue; a swapped one "
                         "would need C^T's z)")


def forward_plan(rows: int, a_strides: tuple[int, int], w: torch.Tensor, bias: Optional[torch.Tensor],
                 cfg: LaunchConfig, *, out_silu: bool = False) -> Optional[_Plan]:
    """The `_plan` that `forward(a, w, bias, cfg, out_silu=out_silu)` launches for an a of `rows` rows and
    these strides when that launch reads the operands as they are (no copy, no maxima pass, a unit-stride
    bias, rows and K present), for a caller that launches it itself (`run_forward_plan`, on a fresh contiguous
    [rows, N] output); else None."""
    N, K = w.shape
    if rows == 0 or N == 0 or K == 0 or needs_maxima(cfg) or (bias is not None and bias.stride(0) != 1):
        return None
    _refuse_fused_silu(cfg, out_silu)
    _input_grad_only(cfg)
    w_strides = (w.stride(0), w.stride(1))
    if cfg.swap_ab:
        return _plan_for(w.device, w_strides, (a_strides[1], a_strides[0]), (1, N), N, rows, K, cfg,
                         w.dtype, bias=bias, m_fixed=True)
    return _plan_for(w.device, a_strides, (w_strides[1], w_strides[0]), (N, 1), rows, N, K, cfg, w.dtype, bias=bias,
                     out_silu=out_silu)


def forward(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], cfg: LaunchConfig, *,
            out_dtype: torch.dtype, out_silu: bool = False, save_pre: bool = False,
            a_max: Optional[torch.Tensor] = None, w_max: Optional[torch.Tensor] = None
            ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """y = epi(a @ w^T + bias): a [M, K] (unit inner stride), w [N, K] row-major, bias [N] or None.

    `out_silu`: y = silu(z) with z = a @ w^T + bias in fp32; `save_pre` also returns z (fp32).
    fp16x3: a row of a is scaled by its own max, a row of w (a column of B) by its own; `a_max` /
    `w_max` are `row_maxima` of a / w when the caller has them (else made here).
    Returns (y, z or None)."""
    M, K = a.shape
    N = w.shape[0]
    y = torch.empty((M, N), dtype=out_dtype, device=a.device)
    pre = torch.empty((M, N), dtype=torch.float32, device=a.device) if (out_silu and save_pre) else None
    if M == 0 or N == 0:
        return y, pre
    if K == 0:
        raise ValueError("forward needs K >= 1")
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()   # the epilogue reads bias[n] at n: a strided view would be read wrong
    scales = Scales(_maxima(a, a_max), _maxima(w, w_max)) if needs_maxima(cfg) else None
    _refuse_fused_silu(cfg, out_silu)
    _input_grad_only(cfg)
    if cfg.swap_ab:   # y^T = w a^T: W's rows are the launch's M (a multiple of its tiles: m_fixed)
        _gemm(w, (w.stride(0), w.stride(1)), a, (a.stride(1), a.stride(0)), y, (y.stride(1), y.stride(0)), N, M, K,
              cfg, bias=bias, m_fixed=True)
        return y, pre
    _gemm(a, (a.stride(0), a.stride(1)), w, (w.stride(1), w.stride(0)), y, (y.stride(0), y.stride(1)), M, N, K, cfg,
          bias=bias, zout=pre, out_silu=out_silu, scales=scales)
    return y, pre


def input_grad(dy: torch.Tensor, w: torch.Tensor, cfg: LaunchConfig, *, dsilu_of: Optional[torch.Tensor] = None,
               out_dtype: torch.dtype = torch.float32, dy_max: Optional[torch.Tensor] = None,
               w_max: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dx = (dy @ w) * silu'(z): dy [M, N], w [N, K], z = `dsilu_of` [M, K] fp32 (or no factor).
    fp16x3: a row of dy is scaled by its own max, w by its whole max (w's rows are the reduction axis);
    `dy_max` / `w_max`: `row_maxima` of dy / w when the caller has them."""
    _forward_only(cfg)
    M, N = dy.shape
    K = w.shape[1]
    dx = torch.empty((M, K), dtype=out_dtype, device=dy.device)
    if M == 0 or K == 0:
        return dx
    if N == 0:
        return dx.zero_()
    if cfg.k_major:
        wt = w.t().contiguous()   # [K, N]: B' = W viewed [N, K] with N (its K) contiguous
        b_strides = (wt.stride(1), wt.stride(0))
        w = wt
    else:
        b_strides = (w.stride(0), w.stride(1))
    scales = Scales(_maxima(dy, dy_max), _maxima(w, w_max), b_all=True) if needs_maxima(cfg) else None
    _gemm(dy, (dy.stride(0), dy.stride(1)), w, b_strides, dx, (dx.stride(0), dx.stride(1)),
          M, K, N, cfg, zin=dsilu_of, scales=scales)
    return dx


def weight_grad(dy: torch.Tensor, a: torch.Tensor, cfg: LaunchConfig, *, a_ones: str = "virtual",
                dw_dtype: torch.dtype, db_dtype: Optional[torch.dtype],
                dy_max: Optional[torch.Tensor] = None, a_max: Optional[torch.Tensor] = None
                ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """dW = dy^T @ a ([N, K_a]) and db = column sums of dy ([N], when `db_dtype` is given), both
    summed over the rows t = 0, 1, ... in one chain per element. db is the GEMM's extra column
    K_a, a column of ones: `a_ones="stored"` reads it from a's buffer (a is a view of
    `silu_cast(..., ones_column=True)`), "virtual" makes it in the kernel.
    fp16x3 (no db: the caller takes `column_sums`): dy and a each scaled by its whole max (their rows are
    the reduction axis; a weight gradient's order is one per T anyway); `dy_max` / `a_max`: `row_maxima`."""
    _forward_only(cfg)
    _input_grad_only(cfg)
    T, N = dy.shape
    K_a = a.shape[1]
    dw = torch.empty((N, K_a), dtype=dw_dtype, device=dy.device)
    db = torch.empty((N,), dtype=db_dtype, device=dy.device) if db_dtype is not None else None
    if T == 0:
        dw.zero_()
        if db is not None:
            db.zero_()
        return dw, db
    if N == 0:
        return dw, db
    with_db = db is not None
    cols = K_a + 1 if with_db else K_a
    stored = with_db and a_ones == "stored"
    if stored and (a.stride(1) != 1 or a.stride(0) < K_a + 1):
        raise ValueError("a_ones='stored' needs a from silu_cast(..., ones_column=True)")
    # stored: load B up to the buffer's 16-aligned width (its pad columns are zeros, never stored), so
    # the column mask is constant over each 16-element vector and the loads stay vectorized
    scales = None
    if cfg.precision == SCALED and with_db:
        raise ValueError(f"an {SCALED} weight gradient makes no db column (take `column_sums` of dy)")
    if needs_maxima(cfg):
        scales = Scales(_maxima(dy, dy_max), _maxima(a, a_max), a_all=True, b_all=True)
    _gemm(dy, (dy.stride(1), dy.stride(0)), a, (a.stride(0), a.stride(1)), dw, (dw.stride(0), dw.stride(1)),
          N, cols, T, cfg, n_main=K_a, n_load=a.stride(0) if stored else K_a, extra=db, ones=with_db and not stored,
          m_fixed=True, scales=scales)
    return dw, db
