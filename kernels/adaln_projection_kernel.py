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
of the three GEMMs computes ONE tile config for every T (tiles, k step, K chunks, warps). What may change
with T is only how the same tiles are fetched, walked and stored (`HOW_FIELDS`: TMA descriptors or
pointers, one program a tile or one an SM, pipeline stages, tile grouping): the same products and sums,
measured bitwise the same on the H200 (every such candidate against the pointer kernel's output at T = 1 to
2048: kernels/notes/gemm.md, "Reduction order"), and `ProjectionConfigs` refuses tiers that differ in anything
else. The silu is elementwise (no order).

Why the silu is a separate launch and not in the GEMM's A-operand load: at T = 2048 every one of the 378
column tiles would redo 2048 x 2688 silus (ex2 + rcp on the SFU, ~1000 cycles per 128 x 64 tile step
against ~1400 of MMA) and read the fp32 temb (2x the bytes of the bf16 a); the separate pass moves 33 MB at
T = 2048 (~8 us at the copy rate) and writes a, which the weight gradient needs anyway. Measured on the H200,
the silu in the A load made the forward ~1.6x slower at T = 1 and 2048 (kernels/notes/gemm.md, `fuse_silu`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from h3bench.kernels import gemm
from h3bench.kernels.common import interpreter_active
from h3bench.kernels.gemm import LaunchConfig as C
from h3bench.kernels.gemm import Tiers, pick

DX_SPLIT = 6   # dtemb = dy W over K = 96768: fixed chunks (part of dtemb's order): 126 programs at T = 1


# LaunchConfig fields that change how a GEMM's tiles are fetched, walked and stored, never what a tile
# computes: tiers of one GEMM may differ in these alone (same tiles, steps and K chunks: the same bits).
HOW_FIELDS = ("tma", "tma_store", "persistent", "num_stages", "group_m")
BIG = 1 << 62
_HOW_DEFAULTS = {name: C.__dataclass_fields__[name].default for name in HOW_FIELDS}


def _order(cfg: C) -> C:
    """What decides the GEMM's bits: `cfg` with its HOW_FIELDS at LaunchConfig's defaults."""
    return dataclasses.replace(cfg, **_HOW_DEFAULTS)


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
    def uniform(cls, fwd: C, dx: C, dw: C) -> "ProjectionConfigs":
        """One config per GEMM for every T."""
        return cls(fwd=((BIG, fwd),), dx=((BIG, dx),), dw=((BIG, dw),))


# Each GEMM's tile, k step and K chunks, one for every T (the order), the fastest of tools/bench_gemm.py's
# candidates (kernels/notes/gemm.md has the figures and the commands):
# - fwd: 128 x 256 x 64, 8 warps (two warp groups of m64n256k16 wgmma), persistent: faster than one program a
#   tile at large T;
# - dx: 128 x 128 x 64, 8 warps, dtemb's K = 96768 in DX_SPLIT fixed chunks: 126 programs stream W at T = 1;
# - dw: 128 x 256 x 64, 8 warps.
_FWD = C(128, 256, 64, num_warps=8, num_stages=4, group_m=16, persistent=True)
_DX = C(128, 128, 64, num_warps=8, num_stages=4, group_m=8, split_k=DX_SPLIT)
_DW = C(128, 256, 64, num_warps=8, num_stages=3, group_m=8, tma=True, tma_store=True, persistent=True)
# How each is fetched, by T (`python -m tools.bench_gemm`, every candidate bitwise the pointer kernel's output;
# the figures at T = 1 to 2048 are in kernels/notes/gemm.md): dW through TMA descriptors, one program
# an SM, stores through a descriptor, at every T (faster than pointers at every T measured); dx and fwd
# through pointers below TMA_FROM, where pointers were faster, and through TMA from it, where TMA was (one
# program an SM for dx; 3 stages and descriptor stores for fwd).
TMA_FROM = 1024
DEFAULT = ProjectionConfigs(
    fwd=((TMA_FROM - 1, _FWD), (BIG, dataclasses.replace(_FWD, num_stages=3, tma=True, tma_store=True))),
    dx=((TMA_FROM - 1, _DX), (BIG, dataclasses.replace(_DX, tma=True, persistent=True))),
    dw=((BIG, _DW),),
)
# One config per GEMM for every T there too (the interpreter steps through programs one by one: large tiles).
INTERPRETER = ProjectionConfigs.uniform(fwd=C(32, 64, 32), dx=C(32, 64, 32, split_k=DX_SPLIT), dw=C(32, 64, 32))
_CONFIGS: list[ProjectionConfigs] = [DEFAULT]


def use_configs(configs: ProjectionConfigs) -> None:
    _CONFIGS[0] = configs


def configs() -> ProjectionConfigs:
    return INTERPRETER if interpreter_active() else _CONFIGS[0]




def forward(temb, w, b, keep_a: bool):
    """(table, a): a kept (with its ones column) when keep_a, for the backward."""
    a = gemm.silu_cast(temb, w.dtype, ones_column=keep_a)
    table, _ = gemm.forward(a, w, b, pick(configs().fwd, temb.shape[0]), out_dtype=w.dtype)
    return table, a


def backward(dy, temb, w, a, need_temb: bool, need_w: bool, need_b: bool):
    """(dtemb, dW, db), None where not needed: dtemb = (dy W) silu'(temb) in temb's dtype, dW = dy^T a and db
    (a's ones column) in w's dtype."""
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
