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
into a fresh accumulator, steps added in fp32) and dx in tf32x3 (each operand split into two tf32
halves, three products a k8 slice, fp32 accumulation). Each row-wise GEMM has one K split and one step
for every T; `MLPConfigs` lets its tiers differ only where the sum a row gets cannot: GEMM2's in the tile,
warps, stages, step pairing and which operand holds W2 (`_one_local_order`), GEMM1's in the tile, warps
and stages (`_one_fp64_order`), dz1 and dx not at all. A row's bits do not depend on T. The weight
gradients are sums over t, one fixed order per T (FMA chains up to T = 64, fp16x3 (dW2, dy and h each
scaled by its whole maximum) or tf32x3 (dW1) above), the bias gradients float64 column sums: they repeat
bitwise run to run.

What the backward keeps (decided by bytes, kernels/notes/gemm.md): h (fp32 [T, 5376]) is written by
GEMM1 anyway, since GEMM2 reads it, and dW2 needs it; z1 (another 21.5 KB a row) is written only
when a gradient will be asked for, because silu'(z1) cannot be had from h, and recomputing z1 would
re-read W1 and redo GEMM1 (5.6 GFLOP at T = 2048, ~0.15 ms of fp64 MMA work) to save ~10 us of writes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.kernels import gemm, graph_cache
from h3bench.kernels.common import interpreter_active
from h3bench.kernels.gemm import LaunchConfig as C
from h3bench.kernels.gemm import Tiers, pick

DX_SPLIT = 6   # dx = dz1 W1 over K = hidden: fixed chunks, the same for every T and every dx config


@dataclass(frozen=True)
class MLPConfigs:
    """Tile configs of the GEMMs, by row count. IEEE (FMA-chain) tiers may differ, see kernels/gemm.py;
    a split is part of the order (dx: DX_SPLIT in every tier; fwd2 and dh: one split each, the same in
    every tier; fwd1 none; the weight gradients, whose order is one per T by nature, any), and a row-wise
    GEMM on tensor cores (tf32x3, fp16x3) or in float64 (fp64) takes one config for every row count, but
    for the tiers `_one_local_order` and `_one_fp64_order` admit. The bias gradients are float64 column
    sums (`gemm.column_sums`) whatever the configs."""

    fwd1: Tiers
    fwd2: Tiers
    dh: Tiers
    dx: Tiers
    dw2: Tiers
    dw1: Tiers

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
    """fp16x3 tiers with each step's own scales that differ only in tiles, warps, stages, step pairing and
    swap_ab: each output element is one fp32 expression of its k steps (the scales, the three products, the
    scale-backs and the adds, `gemm._mainloop`) whatever the tile; that a step's MMA sum does not depend on
    the tile's shape or on which operand holds W is the tensor core's, measured bitwise on the H200 for every
    GEMM2 tile, swapped or not, paired or not (kernels/notes/gemm.md, "Reduction order"; `python -m
    tools.bench_gemm` rechecks rows alone against T = 2048)."""
    def order(cfg: C) -> tuple:
        return cfg.precision, cfg.local_scales, cfg.block_k, cfg.split_k
    return all(cfg.local_scales for _, cfg in tiers) and len({order(cfg) for _, cfg in tiers}) == 1


def _one_fp64_order(tiers: Tiers) -> bool:
    """float64 tiers that differ only in tiles, warps and stages: each output is the fp64 MMA's chain over k
    in k order (products exact, one float64 add a k4 slice) whatever the tile, rounded once to fp32; measured
    bitwise on the H200 for 13 tiles against 32 x 32 x 32's (kernels/notes/gemm.md, "Reduction order")."""
    def order(cfg: C) -> tuple:
        return cfg.precision, cfg.block_k, cfg.split_k
    return all(cfg.precision == "fp64" for _, cfg in tiers) and len({order(cfg) for _, cfg in tiers}) == 1


BIG = 1 << 62
_F64 = {"precision": "fp64"}
_GEMM2 = {"split_k": 6, "precision": "fp16x3", "local_scales": True}
_H3 = {"precision": "fp16x3"}
# The default, and why each choice (kernels/notes/gemm.md, "Launch configuration", has the figures that made
# them and the commands; `python -m tools.bench_gemm --candidate KERNEL:T:CONFIG` times a config against
# the default's at T):
# - fwd1 (GEMM1, K = 256) in float64: z1 and h within half an ulp, so h's error (dW2's at T = 1) stays near
#   cuBLAS's where FMA chains tripled it, and faster than FMA chains at T = 2048. Small tiles on one warp up
#   to 16 rows, where the GEMM is latency-bound; 32 x 32 x 32 above.
# - fwd2 (GEMM2, K = 5376) fp16x3 with each k32 step's own scales in 6 K chunks: no maxima pass re-reading
#   W2's 58 MB. Up to 16 rows swapped (out^T = W2 h^T) on 32 x 16 x 32 tiles, two steps an iteration: the
#   MMA's 16-row side holds T, so no MMA rows idle; 64 x 128 x 32 above 16 rows.
# - dh (dz1 = dy W2 silu'(z1)) fp16x3 with row maxima in 2 K chunks: faster than tf32x3 at T = 2048.
# - dx (dz1 W1) tf32x3 on K-major copies (Hopper's tf32 wgmma reads shared operands K-major only), 6 K
#   chunks, 4 stages.
# - dw2, dw1: FMA chains up to 64 rows (a dW element sums T exact products; tf32x3's ~2^-22 product error
#   would dominate there); above that dw2 fp16x3 and dw1 tf32x3, the fastest measured at T = 2048.
# - db1, db2: float64 column sums (`gemm.column_sums`): b2's error below cuBLAS's, where one fp32 chain over
#   T was an order of magnitude above it.
DEFAULT = MLPConfigs(
    fwd1=((16, C(16, 8, 32, num_warps=1, num_stages=4, **_F64)),
          (BIG, C(32, 32, 32, num_warps=4, num_stages=3, **_F64))),
    fwd2=((16, C(32, 16, 32, num_warps=2, num_stages=3, swap_ab=True, pair_steps=True, **_GEMM2)),
          (BIG, C(64, 128, 32, num_warps=4, num_stages=3, **_GEMM2))),
    dh=((BIG, C(128, 128, 64, num_warps=8, num_stages=3, split_k=2, **_H3)),),
    dx=((BIG, C(64, 64, 32, num_warps=4, num_stages=4, split_k=DX_SPLIT, precision="tf32x3", k_major=True)),),
    dw2=((16, C(32, 64, 16, num_warps=4, num_stages=2)), (64, C(128, 64, 16, num_warps=4, num_stages=3)),
         (BIG, C(128, 128, 64, num_warps=8, num_stages=3, **_H3))),
    dw1=((16, C(32, 64, 16, num_warps=4, num_stages=2)), (64, C(128, 64, 16, num_warps=8, num_stages=3)),
         (BIG, C(128, 64, 32, num_warps=4, num_stages=3, precision="tf32x3"))),
)
# Under the interpreter every GEMM takes one small FMA-chain config for every T (it steps through programs
# one by one: tiles as large as it runs fast with); kernels/interpreted_dot.py makes its dot a fixed-order
# chain, so a row's bits do not depend on T there either. The GPU's config set runs on the CPU in the tests
# that set it (`use_configs` or a patched `configs`).
_I = C(32, 64, 32)
INTERPRETER = MLPConfigs(fwd1=((BIG, _I),), fwd2=((BIG, _I),), dh=((BIG, _I),),
                         dx=((BIG, C(32, 64, 32, split_k=DX_SPLIT)),), dw2=((BIG, _I),), dw1=((BIG, _I),))
_CONFIGS: list[MLPConfigs] = [DEFAULT]   # tools/bench_gemm.py swaps in a candidate (`use_configs`)


def use_configs(configs: MLPConfigs) -> None:
    _CONFIGS[0] = configs


def configs() -> MLPConfigs:
    return INTERPRETER if interpreter_active() else _CONFIGS[0]


# --- checks --------------------------------------------------------------------------------------------





# --- the no-grad forward ---------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Inference:
    """The two launches of a no-grad forward for one (shape, strides, device) under one config set:
    GEMM1 (+ b1, silu) and GEMM2 (+ b2), both reading their operands as they are. plans None: this case
    takes `forward` (a config that needs maxima or copies, a strided bias, zero rows)."""
    configs: MLPConfigs
    plans: Optional[tuple]


_INFERENCE: dict = {}


def inference(x, w1, b1, w2, b2) -> torch.Tensor:
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
        return forward(x, w1, b1, w2, b2, keep_pre=False)[0]
    plan1, plan2 = found.plans
    rows = x.shape[0]
    out = x.new_empty((rows, w2.shape[0]))

    def launch() -> None:
        h = x.new_empty((rows, w1.shape[0]))
        gemm.run_forward_plan(plan1, x, w1, h, bias=b1)
        gemm.run_forward_plan(plan2, h, w2, out, bias=b2)

    # above GRAPH_MAX_ROWS the launches' host time is small beside their kernels, and a graph holds the
    # intermediates (h and the split-K partials: 86 KB a row) in its own pool
    if rows > GRAPH_MAX_ROWS or not GRAPHS.usable(x):
        launch()
        return out
    GRAPHS.run((found,) + graph_cache.placed(x.get_device(), x, w1, b1, w2, b2, out), launch)
    return out


# The no-grad forward's launches as CUDA graphs (kernels/graph_cache.py), on unless H3BENCH_GRAPHS=0: a
# loop's calls with their tensors where the previous call's were replay one graph instead of two Python
# launches, with the same bits: less per-sample time at small T (kernels/notes/gemm.md, "No-grad forward",
# has the figures and the command). At most 8 graphs of at
# most 64 rows, each pool under 6 MB (at 64 rows h is 1.4 MB and GEMM2's six fp32 partial planes 4.1 MB):
# under 50 MB in all.
GRAPH_MAX_ROWS = 64
GRAPHS = graph_cache.GraphCache(on_by_default=True)


def _scaled(*configs: C) -> bool:
    """Whether any of these GEMMs takes its fp16x3 scales from row maxima (not from each step's tiles)."""
    return any(gemm.needs_maxima(cfg) for cfg in configs)


def wants_maxima(cfg: MLPConfigs, rows: int, keep_pre: bool) -> bool:
    """Whether `forward` makes the row maxima of h and w2: when GEMM2 or (keep_pre) dz1 or dW2 takes its
    fp16x3 scales from them."""
    return bool(rows) and (_scaled(pick(cfg.fwd2, rows))
                           or (keep_pre and _scaled(pick(cfg.dh, rows), pick(cfg.dw2, rows))))


def forward(x, w1, b1, w2, b2, keep_pre: bool):
    """(out, h, z1, maxima of h's and w2's rows or None): the maxima, one launch for both, when GEMM2 or
    (keep_pre: a backward will follow) dz1 or dW2 runs in fp16x3, so the backward does not redo them."""
    cfg = configs()
    rows = x.shape[0]
    h, z1 = gemm.forward(x, w1, b1, pick(cfg.fwd1, rows), out_dtype=torch.float32, out_silu=True, save_pre=keep_pre)
    fwd2 = pick(cfg.fwd2, rows)
    maxima = (None, None)
    if wants_maxima(cfg, rows, keep_pre):
        maxima = gemm.row_maxima(h, w2 if w2.stride(1) == 1 else w2.contiguous())   # (unit inner stride)
    out, _ = gemm.forward(h, w2, b2, fwd2, out_dtype=torch.float32, a_max=maxima[0], w_max=maxima[1])
    return out, h, z1, maxima




def backward(dy, x, w1, w2, h, z1, h_max, w2_max, need_x: bool, need_w1: bool, need_b1: bool, need_w2: bool,
             need_b2: bool):
    """(dx, dW1, db1, dW2, db2), None where not needed, from what `forward(keep_pre=True)` kept."""
    if dy.stride(-1) != 1 or (dy.shape[0] > 1 and dy.stride(0) == 0):
        dy = dy.contiguous()
    cfg = configs()
    rows = x.shape[0]
    cfg_dw2, cfg_dh = pick(cfg.dw2, rows), pick(cfg.dh, rows)
    dy_max = gemm.row_maxima(dy)[0] if rows and _scaled(cfg_dw2, cfg_dh) else None
    dw2 = db2 = dx = dw1 = db1 = None
    if need_w2:
        dw2, _ = gemm.weight_grad(dy, h, cfg_dw2, dw_dtype=torch.float32, db_dtype=None, dy_max=dy_max, a_max=h_max)
    if need_b2:
        db2 = _bias_grad(dy)
    if need_x or need_w1 or need_b1:
        dz1 = gemm.input_grad(dy, w2, cfg_dh, dsilu_of=z1, dy_max=dy_max, w_max=w2_max)
        if need_x:
            dx = gemm.input_grad(dz1, w1, pick(cfg.dx, rows))
        if need_w1:
            dw1, _ = gemm.weight_grad(dz1, x, pick(cfg.dw1, rows), dw_dtype=torch.float32, db_dtype=None)
        if need_b1:
            db1 = _bias_grad(dz1)
    return dx, dw1, db1, dw2, db2


def _bias_grad(dy: torch.Tensor) -> torch.Tensor:
    """A bias gradient: dy's column sums in float64, rounded once (`gemm.column_sums`): below cuBLAS's error,
    where one fp32 chain over the rows was an order of magnitude above it (kernels/notes/gemm.md)."""
    return gemm.column_sums(dy if dy.stride(1) == 1 else dy.contiguous(), torch.float32)


