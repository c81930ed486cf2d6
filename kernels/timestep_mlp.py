"""`timestep_mlp(x, w1, b1, w2, b2)` = W2 silu(W1 x + b1) + b2, fp32, batch-invariant, deterministic.

Launches of `kernels.gemm._gemm_kernel` (TF32 off: fp32 accuracy throughout), with the default configs:

    forward   z1 = x W1^T + b1, h = silu(z1)          GEMM1 (float64; epilogue: bias, silu; z1 kept for a backward)
              out = h W2^T + b2                       GEMM2 (fp16x3, each step's own scales; epilogue: bias;
                                                      6 fixed K chunks; up to 16 rows as out^T = W2 h^T)
              max|h[t]|, max|W2[n]|                    `gemm.row_maxima` (one launch; the backward's fp16x3
                                                      scales: only when a backward will follow)
    backward  max|dy[t]|                              `gemm.row_maxima`
              dz1 = (dy W2) * silu'(z1)               `gemm.input_grad` (fp16x3; epilogue: silu'; 2 fixed K chunks)
              dW2 = dy^T h, db2 = colsum(dy)          `gemm.weight_grad` (fp16x3), `gemm.column_sums` (float64)
              dx = dz1 W1                              `gemm.input_grad`, fixed split-K (DX_SPLIT chunks)
              dW1 = dz1^T x, db1 = colsum(dz1)        `gemm.weight_grad`, `gemm.column_sums`

Reduction orders (kernels/gemm.py): GEMM1 runs in float64 (fp64 MMA: exact products, float64 sums,
bias and silu, one rounding of z1 and of h); GEMM2 and dz1 in fp16x3 (operands scaled by powers of two:
in GEMM2 each k32 step's rows of h and of W2 by their own maxima over the step's k; in dz1 dy's rows
by their own maximum, W2 by its whole maximum; each split into fp16 halves, three products a step
into a fresh accumulator, steps added in fp32)
and dx in tf32x3 (each operand split into two tf32 halves, three products a k8 slice, fp32
accumulation); each with ONE tile config and one K split for every T (`MLPConfigs` refuses anything else for fp64 and tensor-core
kernels; GEMM2's tiers differ only in the tile, warps, stages, step pairing and which operand holds W2,
never in the steps, the split or the scales: `_one_local_order`; GEMM1's float64 tiers only in the tile,
warps and stages: `_one_fp64_order`; both checked bitwise on the H200): a row's bits do not depend on T. The weight gradients are sums over t, one fixed order per T (FMA chains
up to T = 64, fp16x3 (dW2, dy and h each scaled by its whole maximum) or tf32x3 (dW1) above), the bias
gradients float64 column sums: they repeat bitwise run to run.

What the backward keeps (decided by bytes, kernels/notes/gemm.md): h (fp32 [T, 5376]) is written by
GEMM1 anyway, since GEMM2 reads it, and dW2 needs it; z1 (another 21.5 KB a row) is written only
when a gradient will be asked for, because silu'(z1) cannot be had from h, and recomputing z1 would
re-read W1 and redo GEMM1 (5.6 GFLOP at T = 2048, ~0.15 ms of fp64 MMA work) to save ~10 us of writes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.kernels import checks, gemm, graph_replay
from h3bench.kernels.common import interpreter_active
from h3bench.kernels.gemm import LaunchConfig as C
from h3bench.kernels.gemm import Tiers, pick

DX_SPLIT = 6   # dx = dz1 W1 over K = hidden: fixed chunks, the same for every T and every dx config


@dataclass(frozen=True)
class MLPConfigs:
    """Tile configs of the GEMMs, by row count. IEEE (FMA-chain) tiers may differ, see kernels/gemm.py;
    a split is part of the order (dx: DX_SPLIT in every tier; fwd2 and dh: one split each, the same in
    every tier; fwd1 none; the weight gradients, whose order is one per T by nature, any), and a row-wise
    GEMM on tensor cores (tf32x3, fp16x3) or in float64 (fp64) takes one config for every row count."""

    fwd1: Tiers
    fwd2: Tiers
    dh: Tiers
    dx: Tiers
    dw2: Tiers
    dw1: Tiers
    # db1, db2 as `gemm.column_sums` (float64, rounded once) instead of the dW GEMM's ones column (one
    # fp32 chain over T): one launch more each; the default's choice (H200: b2 2.9e-8 against 1.4e-6)
    db_blocks: bool = False

    def __post_init__(self):
        for limit, cfg in self.dx:
            if cfg.split_k != DX_SPLIT:
                raise ValueError(f"every dx config needs split_k = {DX_SPLIT} (the order of dx), got {cfg}")
        for limit, cfg in self.fwd1:   # (the weight gradients may split T: their order is one per T anyway)
            if cfg.split_k != 1:
                raise ValueError(f"fwd1 configs take no split-K, got {cfg}")
        for name in ("fwd2", "dh"):   # the split is part of the order, as dx's
            tiers = getattr(self, name)
            if len({cfg.split_k for _, cfg in tiers}) > 1:
                raise ValueError(f"{name}'s split_k must be the same in every tier, got {[c.short() for _, c in tiers]}")
        for name in ("fwd1", "fwd2", "dh", "dx"):  # the row-wise GEMMs: their order must not depend on T
            tiers = getattr(self, name)
            if (name == "fwd2" and _one_local_order(tiers)) or (name == "fwd1" and _one_fp64_order(tiers)):
                continue
            if any(cfg.precision != "ieee" for _, cfg in tiers) and len({cfg for _, cfg in tiers}) > 1:
                raise ValueError(f"{name}: a tf32x3, fp16x3 or fp64 kernel needs one config for every row count, "
                                 f"got {[cfg.short() for _, cfg in tiers]}")


def _one_local_order(tiers: Tiers) -> bool:
    """fp16x3 tiers with each step's own scales that differ only in tiles, warps, stages and swap_ab: each
    output element is one fp32 expression of its k steps (the scales, the three products, the scale-backs
    and the adds, `gemm._mainloop`) whatever the tile; that a step's MMA sum does not depend on the tile's
    shape or on which operand holds W is the tensor core's, checked bitwise on the H200
    (tools/probe_swap_ab.py; kernels/notes/gemm.md v11)."""
    def order(cfg: C) -> tuple:
        return cfg.precision, cfg.local_scales, cfg.block_k, cfg.split_k, cfg.walk_chunks_above
    return all(cfg.local_scales for _, cfg in tiers) and len({order(cfg) for _, cfg in tiers}) == 1


def _one_fp64_order(tiers: Tiers) -> bool:
    """float64 tiers that differ only in tiles, warps and stages: each output is the fp64 MMA's chain over k
    in k order (products exact, one float64 add a k4 slice) whatever the tile, rounded once to fp32; checked
    bitwise on the H200 for 13 tiles against the default's, z1 and h, alone and as rows of T = 2048
    (tools/probe_fwd1.py, logs/session18-call-1; kernels/notes/gemm.md v13)."""
    def order(cfg: C) -> tuple:
        return cfg.precision, cfg.block_k, cfg.split_k
    return all(cfg.precision == "fp64" for _, cfg in tiers) and len({order(cfg) for _, cfg in tiers}) == 1


BIG = 1 << 62
# The FMA-chain configs (v1-v2 in kernels/notes/gemm.md): ieee fp32, tiers by T, bitwise the same for every
# tier (the proof in kernels/gemm.py). fwd1 (K = 256) and the small-T weight gradients keep them below.
IEEE = MLPConfigs(
    fwd1=((4, C(4, 32, 64, num_warps=1, num_stages=3)), (8, C(8, 32, 64, num_warps=1, num_stages=3)),
          (32, C(32, 32, 32, num_warps=2, num_stages=3)), (128, C(32, 64, 32, num_warps=4, num_stages=3)),
          (512, C(64, 64, 16, num_warps=4, num_stages=3, transpose_w=True)),
          (BIG, C(64, 128, 16, num_warps=4, num_stages=3, transpose_w=True))),
    fwd2=((4, C(4, 16, 128, num_warps=1, num_stages=4)), (8, C(8, 16, 128, num_warps=1, num_stages=4)),
          (32, C(32, 16, 64, num_warps=2, num_stages=4)), (128, C(32, 32, 32, num_warps=4, num_stages=3)),
          (512, C(64, 64, 16, num_warps=4, num_stages=3, transpose_w=True)),
          (BIG, C(64, 128, 16, num_warps=4, num_stages=3, transpose_w=True))),
    dh=((4, C(4, 32, 64, num_warps=1, num_stages=4)), (8, C(8, 32, 64, num_warps=1, num_stages=4)),
        (32, C(32, 32, 32, num_warps=2, num_stages=3)), (128, C(32, 64, 32, num_warps=4, num_stages=3)),
        (512, C(64, 64, 16, num_warps=4, num_stages=3)), (BIG, C(64, 128, 16, num_warps=4, num_stages=3))),
    dx=((16, C(16, 16, 64, num_warps=1, num_stages=4, split_k=DX_SPLIT)),
        (128, C(32, 32, 32, num_warps=2, num_stages=3, split_k=DX_SPLIT)),
        (BIG, C(64, 64, 32, num_warps=4, num_stages=3, split_k=DX_SPLIT))),
    dw2=((16, C(32, 64, 16, num_warps=4, num_stages=2)), (BIG, C(128, 64, 16, num_warps=4, num_stages=3))),
    dw1=((16, C(32, 64, 16, num_warps=4, num_stages=2)), (BIG, C(128, 64, 16, num_warps=8, num_stages=3))),
)
_T3 = {"precision": "tf32x3"}
_KM = {"precision": "tf32x3", "k_major": True}
_F64 = {"precision": "fp64"}
# v5's defaults (kernels/notes/gemm.md, from the H200 runs of tools/bench_gemm.py at commits 7ffb2da,
# c7acaa3, 081f3f4 and fcfe379): GEMM1 (K = 256) in float64 (v5: products exact, sums 29 bits wider than
# fp32, z1 and h each rounded once: within ~half an ulp of exact, and 150.6 us at T = 2048 against the FMA
# chains' 209.4); the long-K GEMMs on tensor cores in tf32x3, one config each for every T (fwd2 in 8 fixed
# K chunks: its forward error at T <= 8 was 2-4x cuBLAS's with one chain; dz1 in 2: its 672 output tiles
# of 128 x 128 are 5.09 waves of 132 SMs, 2 x 672 programs fill 10.2 of 11); the weight gradients (any
# order per T) FMA chains up to T = 64, where a dW element is a sum of few exact products, tf32x3 above;
# the bias gradients as float64 column sums. T = 2048 kernels (stream us): fwd1 150.6, fwd2 832.5, dh
# 963.2 (one chunk, persistent: 995.9), dx 118.5-171.2, dw2 866.5, dw1 165.3.
TF32X3_V5 = MLPConfigs(
    fwd1=((BIG, C(32, 64, 32, num_warps=4, num_stages=3, **_F64)),),
    fwd2=((BIG, C(128, 128, 32, num_warps=8, num_stages=3, split_k=8, **_T3)),),
    dh=((BIG, C(128, 128, 32, num_warps=8, num_stages=3, split_k=2, **_KM)),),
    dx=((BIG, C(64, 64, 32, num_warps=4, num_stages=3, split_k=DX_SPLIT, **_KM)),),
    dw2=(IEEE.dw2[0], (64, IEEE.dw2[1][1]), (BIG, C(128, 128, 32, num_warps=8, num_stages=3, persistent=True, **_KM))),
    dw1=(IEEE.dw1[0], (64, IEEE.dw1[1][1]), (BIG, C(128, 64, 32, num_warps=4, num_stages=3, **_T3))),
    db_blocks=True,
)
_H3 = {"precision": "fp16x3"}
# v6 (kernels/notes/gemm.md): the three large GEMMs as three fp16 products per k64 step with
# power-of-two scaled operands (kernels/gemm.py's fp16x3). H200 at 6ecfb00 (tools/bench_gemm.py, stream us
# at T = 2048, error against float64): GEMM2 in 4 fixed K chunks 579.0 (2.79e-7; tf32x3 in 8: 833.9,
# 2.62e-7; one chunk 551.2 but 1.6-1.9x cuBLAS's forward error at T <= 8), dz1 in 2 chunks 590.5 (2.68e-7;
# tf32x3 961.0), dW2 636.8 (3.35e-7; tf32x3 869.4); dx's tf32x3 with 4 stages (the same order as 3:
# 119.5-152.0 us against 171.2-185.8). The whole op at T = 2048: 2266.6 us fwd+bwd against v5's 3301.9.
FP16X3_V6 = dataclasses.replace(
    TF32X3_V5,
    fwd2=((BIG, C(128, 128, 64, num_warps=8, num_stages=3, split_k=4, **_H3)),),
    dh=((BIG, C(128, 128, 64, num_warps=8, num_stages=3, split_k=2, **_H3)),),
    dx=((BIG, C(64, 64, 32, num_warps=4, num_stages=4, split_k=DX_SPLIT, **_KM)),),
    dw2=(IEEE.dw2[0], (64, IEEE.dw2[1][1]), (BIG, C(128, 128, 64, num_warps=8, num_stages=3, **_H3))))
# v7 (kernels/notes/gemm.md): v6 with GEMM2's fp16x3 scales from each step's own tiles
# (`local_scales`) in 6 K chunks: the no-grad forward is two launches and reads W2 once (v6 read it twice:
# its row maxima first, 15 us at T <= 8); H200 (session 14, calls 1-2) kernels per no-grad forward at
# T = 1 / 8: 61.4 / 61.9 us against v6's 76.2 / 76.9 (GEMM2 alone 52 against 52 + 15); GEMM2 at T = 2048
# 799.7 us against 577.8 (the per-step maxima are CUDA-core work an MMA-bound GEMM pays for).
FP16X3_LOCAL_V7 = dataclasses.replace(
    FP16X3_V6, fwd2=((BIG, C(128, 128, 64, num_warps=8, num_stages=3, split_k=6, precision="fp16x3", local_scales=True)),))
# The default, v8: v7 with the tiles session 14's call 3 measured best for small T (tools/bench_gemm.py, each
# config's kernel time per call at T = 1, stream time at T = 2048): GEMM1 on 32 x 32 x 32 float64 tiles
# (6.4 us against 8.4 at T = 1; 145.6 against 150.8-152.8 at T = 2048) and GEMM2 on 64 x 128 x 32 tiles, 4
# warps, 3 stages (40.8 us against 52.3 at T = 1; 876.8 against 800.6-814.3 at T = 2048).
FP16X3_LOCAL_V8 = dataclasses.replace(
    FP16X3_LOCAL_V7, fwd1=((BIG, C(32, 32, 32, num_warps=4, num_stages=3, precision="fp64")),),
    fwd2=((BIG, C(64, 128, 32, num_warps=4, num_stages=3, split_k=6, precision="fp16x3", local_scales=True)),))
# The default, v11 (kernels/notes/gemm.md): v8 with GEMM2 swapped up to 16 rows (`swap_ab`: out^T = W2 h^T
# on 64 x 16 x 32 tiles, 4 warps, 4 stages; the same steps, products and sums as v8's tile, bitwise on the
# H200 at T = 1-16 on four data sets, alone and as rows of T = 2048: tools/probe_swap_ab.py, session 15
# call 1): GEMM2's kernel 28.3-31.2 us at T = 1-16 against 40.3-41.0 (75 registers a thread, 252 programs,
# against 255 and 126); v8's tile above 16 rows.
_S = {"precision": "fp16x3", "local_scales": True, "swap_ab": True}
_FWD2 = FP16X3_LOCAL_V8.fwd2[-1][1]
V11 = dataclasses.replace(
    FP16X3_LOCAL_V8, fwd2=((16, C(64, 16, 32, num_warps=4, num_stages=4, split_k=6, **_S)), (BIG, _FWD2)))
# The default, v16 (kernels/notes/gemm.md): v11 with the small-T tiles session 18's call 1 measured (v13)
# bitwise v11's and fastest (logs/session18-call-1, four data sets, alone and as rows of T = 2048): up to 16 rows
# GEMM2 swapped on 32 x 16 x 32 tiles, 2 warps, 3 stages, two steps an iteration (`pair_steps`; kernel
# 25.1-28.6 us at T = 1-16 against 29.3-31.3) and GEMM1 on 16 x 8 x 32 float64 tiles, 1 warp, 4 stages
# (4.9-5.2 us against 6.3-6.5).
DEFAULT = dataclasses.replace(
    V11, fwd1=((16, C(16, 8, 32, num_warps=1, num_stages=4, precision="fp64")), V11.fwd1[-1]),
    fwd2=((16, C(32, 16, 32, num_warps=2, num_stages=3, split_k=6, pair_steps=True, **_S)), (BIG, _FWD2)))
# GEMM2 with each step's own scales (`local_scales`: no maxima pass over W2 before it, which at T <= 8
# reads the 58 MB of W2 once more) in 4 or 6 K chunks, on 128- or 64-row tiles (bench sets: at T <= 8 the
# forward streams W2, and 64-row tiles halve the MMA work a step; 2688 / 128 x 6 chunks = 126 programs)
_L = {"precision": "fp16x3", "local_scales": True}
FWD2_LOCAL_128K4 = dataclasses.replace(V11, fwd2=((BIG, C(128, 128, 64, num_warps=8, num_stages=3, split_k=4, **_L)),))
FWD2_LOCAL_64K4 = dataclasses.replace(V11, fwd2=((BIG, C(64, 128, 64, num_warps=4, num_stages=4, split_k=4, **_L)),))
FWD2_LOCAL_64K6 = dataclasses.replace(V11, fwd2=((BIG, C(64, 128, 64, num_warps=4, num_stages=4, split_k=6, **_L)),))
# GEMM2 in fixed K chunks of 256 (21 chunks) or 128 / 512, local scales, walked by one program a tile above
# T = 64 (`walk_chunks_above`: the same bits as a program per chunk; at T = 2048 no partials in memory) and
# split into a program per chunk at T <= 64 (441 programs at T <= 128 on 128-row tiles). Session 14, call 2:
# slower than 6 chunks split at every T (GEMM2 at T = 1 78.0 / 71.2 / 118.3 / 61.5 us of kernel for
# 128K21 / 64K21 / 128K42 / 128K11 against 48.0 for 64K6; at T = 2048 933 / 1809 / 1076 / 871 us): each
# chunk restarts the software pipeline, and short programs pay their setup more often.
_W = {"precision": "fp16x3", "local_scales": True, "walk_chunks_above": 64}
FWD2_WALK_128K21 = dataclasses.replace(V11, fwd2=((BIG, C(128, 128, 64, num_warps=8, num_stages=3, split_k=21, **_W)),))
FWD2_WALK_128K11 = dataclasses.replace(V11, fwd2=((BIG, C(128, 128, 64, num_warps=8, num_stages=3, split_k=11, **_W)),))
# GEMM2 swapped at small T (`swap_ab`, kernels/notes/gemm.md v11): up to 16 rows the launch computes
# out^T = W2 h^T, W2's rows the MMA's 64 or 128 and the rows of h a 16-wide N tile (the 64-row tile pads
# T = 1 with 63 zero rows a step: 4x the MMA work, 64 accumulator registers a thread for 1 row of output);
# the same steps, products and sums as v8's tile above 16 rows (`_one_local_order`). M64 is the default.
FWD2_SWAP_M64 = V11
_SWAP16 = V11.fwd2[0][1]


def _small_t(**changes) -> MLPConfigs:
    """V11 with its swapped GEMM2 tier (up to 16 rows) changed by `changes`."""
    return dataclasses.replace(V11, fwd2=((16, dataclasses.replace(_SWAP16, **changes)), (BIG, _FWD2)))


FWD2_SWAP_M128 = _small_t(block_m=128)
# v11 with W2 split once per weight version and stored tile-major (`presplit`: fp16 halves and each (row,
# k32 block)'s inverse scale, cached by kernels.gemm.presplit_of): a step loads W2's halves instead of
# splitting its tile; the same values, products and sums. Bitwise v11's on the H200 and 5.6 us faster a
# forward, not the default (kernels/notes/gemm.md v12: a weight written past its version counter).
FWD2_PRESPLIT = _small_t(presplit=True)
# v11 with two steps a loop iteration (`pair_steps`: both steps split before either's products are issued,
# their sums added in step order): the same values, products and sums; GEMM2 at small T is bound by each
# program's chain of 28 dependent steps (kernels/notes/gemm.md v12), which this overlaps two by two.
FWD2_PAIR = _small_t(pair_steps=True)
# ... with each step's two small products as one dot (`merge_products`: one wait fewer a step)
FWD2_PAIR_MERGE = _small_t(pair_steps=True, merge_products=True)
# ... and v8's tile above 16 rows paired too (at T = 2048 GEMM2 is MMA-bound with each step's split on the
# CUDA cores between: pairs may overlap one step's split with the other's MMAs)
FWD2_PAIR_ALL = dataclasses.replace(
    FWD2_PAIR, fwd2=(FWD2_PAIR.fwd2[0], (BIG, dataclasses.replace(_FWD2, pair_steps=True))))
# GEMM2 in 2 and 8 K chunks (bench sets: the split is part of the order)
FP16X3_K2 = dataclasses.replace(FP16X3_V6, fwd2=((BIG, C(128, 128, 64, num_warps=8, num_stages=3, split_k=2, **_H3)),))
FP16X3_K8 = dataclasses.replace(FP16X3_V6, fwd2=((BIG, C(128, 128, 64, num_warps=8, num_stages=3, split_k=8, **_H3)),))
# v4's default: GEMM1 as the FMA chains (IEEE.fwd1, tiers by T). Its h carries ~3x cuBLAS's error, which
# at T = 1 is dW2's whole error (a dW2 element is dy * h there): w2 3.08x cuBLAS's (evidence at 296b918).
FMA_FWD1 = dataclasses.replace(TF32X3_V5, fwd1=IEEE.fwd1)


def uniform(fwd1: C, fwd2: C, dh: C, dx: C, dw2: C, dw1: C, db_blocks: bool = False) -> MLPConfigs:
    """One config per GEMM for every row count (what tf32x3 kernels need: no proof covers two tiles)."""
    return MLPConfigs(fwd1=((BIG, fwd1),), fwd2=((BIG, fwd2),), dh=((BIG, dh),), dx=((BIG, dx),),
                      dw2=((BIG, dw2),), dw1=((BIG, dw1),), db_blocks=db_blocks)


# Tensor-core candidates (kernels/notes/gemm.md v4): every GEMM in tf32x3 on wgmma (BLOCK_M 64 or 128,
# warps a multiple of 4), one config each for every T, bias gradients as float64 column sums; the
# input and weight gradients on K-major copies of their operands (`k_major`). tools/bench_gemm.py
# times them end to end.
TF32X3_KM = uniform(fwd1=C(128, 128, 32, num_warps=8, num_stages=3, **_T3),
                    fwd2=C(128, 128, 32, num_warps=8, num_stages=3, persistent=True, **_T3),
                    dh=C(128, 128, 32, num_warps=8, num_stages=3, **_KM),
                    dx=C(128, 64, 32, num_warps=4, num_stages=3, split_k=DX_SPLIT, **_KM),
                    dw2=C(128, 128, 32, num_warps=8, num_stages=3, **_KM),
                    dw1=C(128, 64, 32, num_warps=4, num_stages=3, **_KM), db_blocks=True)
# GEMM2's K = 5376 as 8 fixed chunks (split-K): each output's fp32 chain is 8x shorter; its forward error
# at T <= 8 is 2-4x cuBLAS's (gemv, tree-reduced) with one chain (H200, v4).
TF32X3_KM_S8 = dataclasses.replace(TF32X3_KM, fwd2=TF32X3_V5.fwd2)   # the default's GEMM2 (8 K chunks)
# v5's first default: dz1 in one K chunk, persistent (995.9 us at T = 2048 against the split's 963.2)
DH_PERSISTENT = dataclasses.replace(TF32X3_V5, dh=((BIG, C(128, 128, 32, num_warps=8, num_stages=3, persistent=True,
                                                         **_KM)),))
TF32X3_KM_P = uniform(fwd1=C(128, 128, 32, num_warps=8, num_stages=3, persistent=True, **_T3),
                      fwd2=C(128, 128, 32, num_warps=8, num_stages=3, persistent=True, **_T3),
                      dh=C(128, 128, 32, num_warps=8, num_stages=3, persistent=True, **_KM),
                      dx=C(128, 64, 32, num_warps=4, num_stages=3, split_k=DX_SPLIT, **_KM),
                      dw2=C(128, 128, 32, num_warps=8, num_stages=3, persistent=True, **_KM),
                      dw1=C(128, 128, 32, num_warps=8, num_stages=3, **_KM), db_blocks=True)
# Under the interpreter a dot is numpy's matmul, not the FMA chain: the row-count independence of
# the order then holds only with one tile shape for all T, so every GEMM uses one small config there.
# Tiles as large as the interpreter runs fast with (it steps through programs one by one).
_I = C(32, 64, 32)
INTERPRETER = MLPConfigs(fwd1=((BIG, _I),), fwd2=((BIG, _I),), dh=((BIG, _I),),
                         dx=((BIG, C(32, 64, 32, split_k=DX_SPLIT)),), dw2=((BIG, _I),), dw1=((BIG, _I),))
_CONFIGS: list[MLPConfigs] = [DEFAULT]   # the bench swaps in candidates (`use_configs`)


def use_configs(configs: MLPConfigs) -> None:
    _CONFIGS[0] = configs


def configs() -> MLPConfigs:
    return INTERPRETER if interpreter_active() else _CONFIGS[0]


# --- checks --------------------------------------------------------------------------------------------

def _check(x, w1, b1, w2, b2) -> None:
    named = {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2}
    checks.tensors(named)
    checks.same_device(named, "x")
    checks.triton_device("x", x, what="the Triton kernels need", any_device_interpreted=True)
    for name, t in named.items():
        checks.dtype_in(name, t, (torch.float32,), "timestep_mlp is fp32 throughout (expected torch.float32)")
    if x.dim() != 2:
        raise ValueError(f"x must be [T, freq_dim], got shape {tuple(x.shape)}")
    if w1.dim() != 2 or w1.shape[1] != x.shape[1] or w1.shape[0] < 1:
        raise ValueError(f"w1 must be [hidden, {x.shape[1]}] (x is [T, {x.shape[1]}]), got {tuple(w1.shape)}")
    if x.shape[1] < 1:
        raise ValueError(f"x must have freq_dim >= 1, got shape {tuple(x.shape)}")
    hidden = w1.shape[0]
    if b1.shape != (hidden,):
        raise ValueError(f"b1 must have shape ({hidden},) to match w1, got {tuple(b1.shape)}")
    if w2.dim() != 2 or w2.shape[1] != hidden or w2.shape[0] < 1:
        raise ValueError(f"w2 must be [temb_dim, {hidden}] (w1 has {hidden} rows), got {tuple(w2.shape)}")
    if b2.shape != (w2.shape[0],):
        raise ValueError(f"b2 must have shape ({w2.shape[0]},) to match w2, got {tuple(b2.shape)}")


def _fast_ok(x, w1, b1, w2, b2) -> bool:
    """Every argument well formed and all on one CUDA device, or all on the CPU under the interpreter (the
    common case, checked with attribute reads only; the CPU case so the tests and tools/hostcost_cpu.py
    take the path a GPU call takes). False sends the call through `_check`, which raises naming the
    argument or accepts what this does not cover. True only where `_check` passes (tests)."""
    try:
        f32 = torch.float32
        if not (x.dtype == f32 and w1.dtype == f32 and b1.dtype == f32 and w2.dtype == f32 and b2.dtype == f32):
            return False
        device = x.get_device()
        if device >= 0:
            same = (x.is_cuda and w1.is_cuda and b1.is_cuda and w2.is_cuda and b2.is_cuda
                    and w1.get_device() == device and b1.get_device() == device and w2.get_device() == device
                    and b2.get_device() == device)
        else:
            same = x.is_cpu and w1.is_cpu and b1.is_cpu and w2.is_cpu and b2.is_cpu and interpreter_active()
        hidden = w1.shape[0]
        return (same and x.dim() == 2 and w1.dim() == 2 and w2.dim() == 2 and b1.dim() == 1 and b2.dim() == 1
                and 0 < x.shape[1] == w1.shape[1] and 0 < hidden == b1.shape[0] == w2.shape[1]
                and 0 < w2.shape[0] == b2.shape[0])
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return False


# --- the no-grad forward ---------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Inference:
    """The two launches of a no-grad forward for one (shape, strides, device) under one config set:
    GEMM1 (+ b1, silu) and GEMM2 (+ b2), both reading their operands as they are. plans None: this case
    takes `_forward` (a config that needs maxima or copies, a strided bias, zero rows)."""
    configs: MLPConfigs
    plans: Optional[tuple]


_INFERENCE: dict = {}


def _inference(x, w1, b1, w2, b2) -> torch.Tensor:
    """The no-grad forward with its shape-dependent work done once per (shape, strides, device, config
    set): at T <= 8 the host time of a call is most of its time (two launches, two allocations here)."""
    cfg = configs()
    key = (x.shape, x.stride(), w1.stride(), w2.shape, w2.stride(), b1.stride(), b2.stride(), x.device)
    found = _INFERENCE.get(key)
    if found is None or found.configs is not cfg:
        rows = x.shape[0]
        plan1 = gemm.forward_plan(rows, x.stride(), w1, b1, pick(cfg.fwd1, rows), out_silu=True)
        plan2 = gemm.forward_plan(rows, (w1.shape[0], 1), w2, b2, pick(cfg.fwd2, rows))   # h: fresh, contiguous
        if len(_INFERENCE) >= 4096:   # a recipe per T: bounded like gemm._plan's cache
            _INFERENCE.clear()
        found = _INFERENCE[key] = _Inference(cfg, (plan1, plan2) if plan1 and plan2 else None)
    if found.plans is None:
        return _forward(x, w1, b1, w2, b2, keep_pre=False)[0]
    plan1, plan2 = found.plans
    rows = x.shape[0]
    out = x.new_empty((rows, w2.shape[0]))

    def launch() -> None:
        h = x.new_empty((rows, w1.shape[0]))
        gemm.run_forward_plan(plan1, x, w1, h, bias=b1)
        gemm.run_forward_plan(plan2, h, w2, out, bias=b2)

    # a presplit is made per weight version: not in a graph; above GRAPH_MAX_ROWS the launches' host time is
    # small beside their kernels, and a graph holds the intermediates (h and the split-K partials: 86 KB a
    # row) in its own pool
    if plan2.presplit or rows > GRAPH_MAX_ROWS or not GRAPHS.usable(x):
        launch()
        return out
    GRAPHS.run((found,) + graph_replay.placed(x.get_device(), x, w1, b1, w2, b2, out), launch)
    return out


# The no-grad forward's launches as CUDA graphs (kernels/graph_replay.py), on unless H3BENCH_GRAPHS=0: a
# loop's calls with their tensors where the previous call's were replay one graph instead of two Python
# launches (H200, kernels/notes/gemm.md v14: T = 1 forward 71.5 / 57.0 -> 55.5 / 40.5 us synchronized /
# stream, the same bits). At most 8 graphs of at most 64 rows, each pool under 6 MB (at 64 rows h is 1.4 MB and
# GEMM2's six fp32 partial planes 4.1 MB): under 50 MB in all.
GRAPH_MAX_ROWS = 64
GRAPHS = graph_replay.GraphCache(on_by_default=True)


# --- autograd ------------------------------------------------------------------------------------------

def _scaled(*configs: C) -> bool:
    """Whether any of these GEMMs takes its fp16x3 scales from row maxima (not from each step's tiles)."""
    return any(gemm.needs_maxima(cfg) for cfg in configs)


def _forward(x, w1, b1, w2, b2, keep_pre: bool):
    """(out, h, z1, maxima of h's and w2's rows or None): the maxima, one launch for both, when GEMM2 or
    (keep_pre: a backward will follow) dz1 or dW2 runs in fp16x3, so the backward does not redo them."""
    cfg = configs()
    rows = x.shape[0]
    h, z1 = gemm.forward(x, w1, b1, pick(cfg.fwd1, rows), out_dtype=torch.float32, out_silu=True, save_pre=keep_pre)
    fwd2 = pick(cfg.fwd2, rows)
    maxima = (None, None)
    if rows and (_scaled(fwd2) or (keep_pre and _scaled(pick(cfg.dh, rows), pick(cfg.dw2, rows)))):
        maxima = gemm.row_maxima(h, w2 if w2.stride(1) == 1 else w2.contiguous())   # (unit inner stride)
    out, _ = gemm.forward(h, w2, b2, fwd2, out_dtype=torch.float32, a_max=maxima[0], w_max=maxima[1])
    return out, h, z1, maxima


class _TimestepMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        out, h, z1, (h_max, w2_max) = _forward(x, w1, b1, w2, b2, keep_pre=True)
        ctx.save_for_backward(x, w1, w2, h, z1, h_max, w2_max)
        return out

    @staticmethod
    def backward(ctx, dy):
        x, w1, w2, h, z1, h_max, w2_max = ctx.saved_tensors
        need_x, need_w1, need_b1, need_w2, need_b2 = ctx.needs_input_grad[:5]
        if dy.stride(-1) != 1 or (dy.shape[0] > 1 and dy.stride(0) == 0):
            dy = dy.contiguous()
        cfg = configs()
        rows = x.shape[0]
        cfg_dw2, cfg_dh = pick(cfg.dw2, rows), pick(cfg.dh, rows)
        dy_max = gemm.row_maxima(dy)[0] if rows and _scaled(cfg_dw2, cfg_dh) else None
        dw2 = db2 = dx = dw1 = db1 = None
        if need_w2 or need_b2:
            dw2, db2 = gemm.weight_grad(dy, h, cfg_dw2, dw_dtype=torch.float32, db_dtype=torch.float32 if need_b2 else None,
                                        db_blocks=cfg.db_blocks, dy_max=dy_max, a_max=h_max)
        if need_x or need_w1 or need_b1:
            dz1 = gemm.input_grad(dy, w2, cfg_dh, dsilu_of=z1, dy_max=dy_max, w_max=w2_max)
            if need_x:
                dx = gemm.input_grad(dz1, w1, pick(cfg.dx, rows))
            if need_w1 or need_b1:
                dw1, db1 = gemm.weight_grad(dz1, x, pick(cfg.dw1, rows), dw_dtype=torch.float32,
                                            db_dtype=torch.float32 if need_b1 else None, db_blocks=cfg.db_blocks)
        return dx, (dw1 if need_w1 else None), db1, (dw2 if need_w2 else None), db2


def timestep_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                 b2: torch.Tensor) -> torch.Tensor:
    """out = W2 silu(W1 x + b1) + b2 with gradients for x, w1, b1, w2 and b2.

    x: [T, F] fp32; w1: [Hd, F]; b1: [Hd]; w2: [D, Hd]; b2: [D], all fp32 on one device (CUDA, or the
    CPU under TRITON_INTERPRET=1). T = 0 gives an empty [0, D] output and zero weight gradients.
    Each output row is bitwise the same whatever T is; the weight gradients repeat bitwise."""
    if not _fast_ok(x, w1, b1, w2, b2):
        _check(x, w1, b1, w2, b2)
    if x.is_cuda and x.get_device() != torch.cuda.current_device():
        with torch.cuda.device(x.device):  # triton launches on the current device
            return timestep_mlp(x, w1, b1, w2, b2)
    if torch.is_grad_enabled() and (x.requires_grad or w1.requires_grad or b1.requires_grad or w2.requires_grad
                                    or b2.requires_grad):
        return _TimestepMLP.apply(x, w1, b1, w2, b2)
    return _inference(x, w1, b1, w2, b2)
