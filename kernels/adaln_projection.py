"""`adaln_projection(temb, w, b)` = W bf16(silu(temb)) + b, batch-invariant and deterministic.

    forward   a = bf16(silu(temb)) | 1              `gemm.silu_cast` (fp32 silu, one rounding; the ones
                                                    column is the weight-gradient GEMM's db column)
              table = a W^T + b                     `gemm.forward`: bf16 wgmma, fp32 accumulator, + b in
                                                    fp32, one rounding to bf16
    backward  dtemb = (dy W) * silu'(temb)          `gemm.input_grad`, fixed split-K (the dx config's chunks
                                                    of W's 96768 rows), fp32 out; the cast's gradient is the
                                                    identity (as autograd's), dy W is not rounded to bf16
              dW = dy^T a, db = colsum(dy)          `gemm.weight_grad` (db = the ones column of a)

Reduction orders: kernels/gemm.py. bf16 dots have no proof that two tile configs sum alike, so each
of the three GEMMs computes ONE tile config for every T (tiles, k step, K chunks, warps), chosen by the GPU
bench among candidates that are each batch-invariant by themselves. What may change with T is only how
the same tiles are fetched, walked and stored (`HOW_FIELDS`: TMA descriptors or pointers, one program a
tile or one an SM, pipeline stages, tile grouping): the same products and sums, bitwise the same on the
H200 (kernels/notes/gemm.md v15), and `ProjectionConfigs` refuses tiers that differ in anything else.
The silu is elementwise (no order).

Why the silu is a separate launch and not in the GEMM's A-operand load (`gemm.forward(a_silu=True)`
does that): at T = 2048 every one of the 378 column tiles would redo 2048 x 2688 silus (ex2 + rcp on
the SFU, ~1000 cycles per 128 x 64 tile step against ~1400 of MMA) and read the fp32 temb (2x the
bytes of the bf16 a); the separate pass costs ~3 us and writes a (11 MB at T = 2048), which the
weight gradient needs anyway. The fused variant is one of the bench's forward candidates.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from h3bench.kernels import checks, gemm
from h3bench.kernels.common import interpreter_active
from h3bench.kernels.gemm import LaunchConfig as C
from h3bench.kernels.gemm import Tiers, pick

DX_SPLIT = 6   # dtemb = dy W over K = 96768: fixed chunks (part of dtemb's order): 126 programs at T = 1


# LaunchConfig fields that change how a GEMM's tiles are fetched, walked and stored, never what a tile
# computes: tiers of one GEMM may differ in these alone (same tiles, steps and K chunks: the same bits).
HOW_FIELDS = ("tma", "tma_store", "persistent", "num_stages", "group_m")
BIG = 1 << 62
_HOW_DEFAULTS = {name: C.__dataclass_fields__[name].default for name in HOW_FIELDS}


def _order(cfg: C) -> tuple[C, bool]:
    """What decides the GEMM's bits: `cfg` with its HOW_FIELDS at LaunchConfig's defaults, and whether its K
    loop is warp-specialized (kept apart until the H200 shows that loop's bits are the plain one's; a
    warp-specialized config is a tma one, so it cannot take HOW_FIELDS' defaults itself)."""
    return dataclasses.replace(cfg, **_HOW_DEFAULTS, warp_specialize=False), cfg.warp_specialize


class ProjectionLaunch(NamedTuple):
    """The three GEMMs' configs at one T."""
    fwd: C
    dx: C
    dw: C


@dataclass(frozen=True)
class ProjectionConfigs:
    """Each GEMM's configs by T: tiers (largest T, config), ascending, the last for the rest."""
    fwd: Tiers
    dx: Tiers
    dw: Tiers
    fuse_silu: bool = False   # silu + cast in the forward GEMM's A load instead of `gemm.silu_cast`

    def __post_init__(self):
        for name in ("fwd", "dx", "dw"):
            tiers = getattr(self, name)
            if not tiers or tiers[-1][0] < BIG or [t for t, _ in tiers] != sorted(t for t, _ in tiers):
                raise ValueError(f"{name}: tiers must ascend and end with BIG (every T), got {tiers}")
            # dx's split_k is part of dtemb's order like the rest of its tile config
            if len({_order(cfg) for _, cfg in tiers}) > 1:
                raise ValueError(f"{name}: tiers may differ only in {', '.join(HOW_FIELDS)} (the same tiles, steps "
                                 f"and K chunks), got {[cfg.short() for _, cfg in tiers]}")
        if any(cfg.split_k != 1 for _, cfg in tuple(self.fwd) + tuple(self.dw)):
            raise ValueError("the forward and dW configs take no split-K")

    def at(self, rows: int) -> ProjectionLaunch:
        return ProjectionLaunch(pick(self.fwd, rows), pick(self.dx, rows), pick(self.dw, rows))

    @classmethod
    def uniform(cls, fwd: C, dx: C, dw: C, fuse_silu: bool = False) -> "ProjectionConfigs":
        """One config per GEMM for every T."""
        return cls(fwd=((BIG, fwd),), dx=((BIG, dx),), dw=((BIG, dw),), fuse_silu=fuse_silu)


# v4's defaults: the fastest of tools/bench_gemm.py's candidates on the H200 (kernels/notes/gemm.md, v2 and
# v4): 4 pipeline stages for dW (3 before: -56 us at T = 2048); the forward persistent (v4: 1593.8 us at
# T = 2048 against 2108.8, 133.0 against 140.4 at T = 1). Every GEMM through pointers.
POINTER = ProjectionConfigs.uniform(
    fwd=C(128, 256, 64, num_warps=8, num_stages=4, group_m=16, persistent=True),
    dx=C(128, 128, 64, num_warps=8, num_stages=4, group_m=8, split_k=DX_SPLIT),
    dw=C(128, 256, 64, num_warps=8, num_stages=4, group_m=8),
)
_P = POINTER.at(1)
# The forward and dW persistent (v4 candidate: dW persistent measured slower, 1994 us against 1839).
PERSISTENT = ProjectionConfigs.uniform(
    fwd=_P.fwd, dx=_P.dx, dw=C(128, 256, 64, num_warps=8, num_stages=3, group_m=8, persistent=True))
# The pointer set's tiles, steps and K chunks with A and B read through TMA descriptors, every GEMM one
# program per SM over its (tile, K chunk) items (kernels/notes/gemm.md v15): the same bits as POINTER's
# (kernels/gemm.py `_gemm_tma_kernel`), checked on the GPU by tools/bench_gemm.py's candidates.
TMA = ProjectionConfigs.uniform(
    fwd=dataclasses.replace(_P.fwd, tma=True),
    dx=dataclasses.replace(_P.dx, tma=True, persistent=True),
    dw=dataclasses.replace(_P.dw, tma=True, persistent=True),
)
# TMA and the forward's and dW's tiles stored through a descriptor as well (`tma_store`: the stores run under
# the next tile's MMAs); dx keeps its split (its partials are fp32 sums)
TMA_STORE = ProjectionConfigs.uniform(
    fwd=dataclasses.replace(TMA.at(1).fwd, tma_store=True),
    dx=TMA.at(1).dx,
    dw=dataclasses.replace(TMA.at(1).dw, tma_store=True),
)
# The default, v16 (kernels/notes/gemm.md): POINTER's tiles, steps and chunks at every T, fetched as measured
# fastest on the H200 (tools/bench_gemm.py `--ada-same-tiles`, stream us, every candidate bitwise POINTER's;
# session 18 call 2 and session 19 call 1, logs/session19-call-1/bench_ada_switch.json):
#   dW   TMA, persistent, 3 stages, TMA stores at every T: T = 1 246.6 / 245.6 against 330.3 / 331.4, T = 256
#        357.9 against 456.8, T = 2048 1755.8 / 1739.5 against 1852.9 / 1872.9;
#   dx   pointers below TMA_FROM (T <= 64 134-142 us against TMA's 163-205; even at 128-512), TMA persistent
#        from it (T = 1024 896.5 against 914.5, T = 2048 1800.3 / 1767.1 against 1836.3 / 1820.4);
#   fwd  likewise (T <= 64 129-136 against 146-178; 256-512 even), TMA, 3 stages, TMA stores from TMA_FROM
#        (T = 1024 798.8 against 810.2, T = 2048 1574.6 / 1574.8 against 1613.5 / 1592.5).
TMA_FROM = 1024
DEFAULT = ProjectionConfigs(
    fwd=((TMA_FROM - 1, _P.fwd), (BIG, dataclasses.replace(TMA_STORE.at(1).fwd, num_stages=3))),
    dx=((TMA_FROM - 1, _P.dx), (BIG, TMA.at(1).dx)),
    dw=((BIG, dataclasses.replace(TMA_STORE.at(1).dw, num_stages=3)),),
)
# One config per GEMM for every T there too (the interpreter steps through programs one by one: large tiles).
INTERPRETER = ProjectionConfigs.uniform(fwd=C(32, 64, 32), dx=C(32, 64, 32, split_k=DX_SPLIT), dw=C(32, 64, 32))
# TMA's tiles, steps and chunks with the K loop warp-specialized (kernels/notes/gemm.md v17): one producer warp
# group issues the TMA loads, two consumer groups (64 rows of the tile each, as TMA's 8 warps split it) issue
# the wgmmas. A variant for every T until measured: its 4 warps are not a tier's difference (`HOW_FIELDS`)
# until the H200 shows its bits are TMA's (tools/bench_gemm.py `bitwise_equal_default`). sm_90 (triton 3.6):
# 168 registers on 12 warps, no spills; 180 KB of shared memory (fwd, dW at 3 stages), 197 KB (dx, 4 stages)
WS = ProjectionConfigs.uniform(
    fwd=dataclasses.replace(TMA.at(1).fwd, num_warps=4, num_stages=3, warp_specialize=True),
    dx=dataclasses.replace(TMA.at(1).dx, num_warps=4, warp_specialize=True),
    dw=dataclasses.replace(TMA.at(1).dw, num_warps=4, num_stages=3, warp_specialize=True))
# WS with dtemb's K in 3 chunks instead of 6 (another order for dtemb, one for every T): at T = 2048 528 items of
# 128 x 128 split 3, 4 an SM exactly, where split 6 pays twice the partials (session 19 call 1: the split-3 tma
# candidate 1660 us against 1767-1820 at T = 2048, ~170 us more at T <= 8, where half the programs stream W)
WS_DX3 = dataclasses.replace(WS, dx=((BIG, dataclasses.replace(WS.at(1).dx, split_k=3)),))
_CONFIGS: list[ProjectionConfigs] = [DEFAULT]


def use_configs(configs: ProjectionConfigs) -> None:
    _CONFIGS[0] = configs


def configs() -> ProjectionConfigs:
    return INTERPRETER if interpreter_active() else _CONFIGS[0]


def _check(temb, w, b) -> None:
    named = {"temb": temb, "w": w, "b": b}
    checks.tensors(named)
    checks.same_device(named, "temb")
    checks.triton_device("temb", temb, what="the Triton kernels need", any_device_interpreted=True)
    checks.dtype_in("temb", temb, checks.FLOATS, "expected float32 (or bfloat16, float16)")
    checks.dtype_in("w", w, (torch.bfloat16, torch.float16), "expected bfloat16 or float16 (the tensor-core GEMM)")
    checks.same_dtype(named, ("b",), "w")
    if temb.dim() != 2 or temb.shape[1] < 1:
        raise ValueError(f"temb must be [T, temb_dim] with temb_dim >= 1, got shape {tuple(temb.shape)}")
    if w.dim() != 2 or w.shape[1] != temb.shape[1] or w.shape[0] < 1:
        raise ValueError(f"w must be [out_features, {temb.shape[1]}] (temb is [T, {temb.shape[1]}]), "
                         f"got {tuple(w.shape)}")
    if b.shape != (w.shape[0],):
        raise ValueError(f"b must have shape ({w.shape[0]},) to match w, got {tuple(b.shape)}")


def _forward(temb, w, b, keep_a: bool):
    cfg = configs()
    fwd = pick(cfg.fwd, temb.shape[0])
    if cfg.fuse_silu:
        table, _ = gemm.forward(temb, w, b, fwd, out_dtype=w.dtype, a_silu=True)
        a = gemm.silu_cast(temb, w.dtype, ones_column=True) if keep_a else None
        return table, a
    a = gemm.silu_cast(temb, w.dtype, ones_column=keep_a)
    table, _ = gemm.forward(a, w, b, fwd, out_dtype=w.dtype)
    return table, a


class _AdaLNProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, temb, w, b):
        table, a = _forward(temb, w, b, keep_a=True)
        ctx.save_for_backward(temb, w, a)
        return table

    @staticmethod
    def backward(ctx, dy):
        temb, w, a = ctx.saved_tensors
        need_temb, need_w, need_b = ctx.needs_input_grad[:3]
        if dy.stride(-1) != 1 or (dy.shape[0] > 1 and dy.stride(0) == 0):
            dy = dy.contiguous()
        cfg, rows = configs(), dy.shape[0]
        dtemb = dw = db = None
        if need_temb:
            dtemb = gemm.input_grad(dy, w, pick(cfg.dx, rows), dsilu_of=temb, out_dtype=temb.dtype)
        if need_w or need_b:
            dw, db = gemm.weight_grad(dy, a, pick(cfg.dw, rows), a_ones="stored", dw_dtype=w.dtype,
                                      db_dtype=w.dtype if need_b else None)
        return dtemb, (dw if need_w else None), db


def adaln_projection(temb: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """table = W cast(silu(temb)) + b with gradients for temb, w and b.

    temb: [T, D] fp32 (bf16/fp16 accepted); w: [N, D] bf16 or fp16; b: [N] in w's dtype; one device
    (CUDA, or the CPU under TRITON_INTERPRET=1). Returns [T, N] in w's dtype. T = 0 gives an empty
    table and zero weight gradients. Each table row is bitwise the same whatever T is; dW and db
    repeat bitwise."""
    _check(temb, w, b)
    if temb.device.type == "cuda" and temb.device.index != torch.cuda.current_device():
        with torch.cuda.device(temb.device):
            return adaln_projection(temb, w, b)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (temb, w, b)):
        return _AdaLNProjection.apply(temb, w, b)
    return _forward(temb, w, b, keep_a=False)[0]
