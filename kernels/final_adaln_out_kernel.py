"""final_adaln_out: the 3-row AdaLN projection (F.linear), then our norm_modulate Triton kernel.

    [shift | scale] = (W bf16(silu(temb)) + b).chunk(2)          temb: [T, D], W (`w`): [2H, D], b: [2H]
    out = rms_norm(x, nw, eps) * (1 + scale[ti]) + shift[ti]      x: [S, H], nw: [H], ti: [S]

(diffusers' `MiniMaxH3AdaLayerNormOut`: silu in temb's dtype, one cast to W's dtype, the projection in
W's dtype, shift the first half.)

The per-row work is `kernels.norm_modulate_api.norm_modulate(x, nw, shift, scale, ti)` with M = T table
rows: its forward and dx are batch-invariant and its parameter gradients (dnw, dshift, dscale) are
summed in a fixed order without atomics (kernels/norm_modulate_kernel.py documents the order). shift and scale
are the two column halves of the projection, passed as row-strided views (no copy).

The projection's GEMM is torch's `F.linear`. Its input has T = 3 rows whatever S is, so it is
batch-invariant by construction: the same GEMM on the same [3, D] operand for every batch. Its
gradients have shapes fixed by (T, D, H), independent of S: dW = dproj^T a (a [2H, 3] x [3, D] GEMM),
da = dproj W, db = dproj summed over the T rows, dtemb = silu'(temb) da, each one kernels/gemm.py config for
every T and S (`PROJECTION_DX`, `PROJECTION_DW`: fixed split-K chunks, t-ascending chains), so the
parameter gradients repeat bitwise. Only dproj carries S, and it comes from norm_modulate's fixed-order
reduction.

By default (`LaunchConfig.one_node`) the whole op is one autograd node (`_FinalAdaLNOut`) whose forward
runs the projection (a = `gemm.silu_cast(temb)`, then F.linear) and then norm_modulate's forward launcher
directly (the arguments were checked here once; shift is passed as the whole [T, 2H] projection, whose row
stride the kernel takes, scale as a view of its second half), and whose backward has norm_modulate's
backward launcher write dshift and dscale straight into the halves of one [T, 2H] dproj buffer (no
torch.cat), then runs the projection's backward as two kernels/gemm.py launches (`triton_grads`). At
S = 32768 a forward+backward is host-bound on the H200 VMs (kernels/notes/final_adaln_out.md): every
default here removes host work, not GPU work.

The other `LaunchConfig` switches are the variants tools/bench_memory_ops.py and tools/hostcost_cpu.py time
against the default (kernels/notes/final_adaln_out.md has their H200 figures): two autograd nodes
(`one_node=False`: `_Projection`, then norm_modulate's public function), autograd's own composition
(`projection_node=False`), torch's silu and cast (`triton_silu=False`), torch's backward calls
(`triton_grads=False`), the forward as one gemm launch (`triton_projection`). The one- and two-node paths
run the same kernels in the same order: the same bits (tests/test_kernel_final_adaln_out.py compares them).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from h3bench.kernels import checks, gemm
from h3bench.kernels import norm_modulate_kernel as NM
from h3bench.kernels.norm_modulate_api import as_rows, global_plan, norm_modulate


@dataclass(frozen=True)
class LaunchConfig:
    """The row kernel's launch configuration is norm_modulate's own tuned default (its public function
    takes none); what is chosen here is how the projection runs and is differentiated."""

    projection_node: bool = True  # one autograd Function for silu + cast + linear (False: autograd's four)
    # the projection's forward as one launch of kernels/gemm.py (silu and the cast fused into its A load)
    # instead of silu_cast and F.linear. Off: H200, commit 3c77436, net fwd+bwd at S = 32768 785.5 / 679.5 us
    # sync / stream against the default's 718.0 / 670.7 (at commit c7acaa3 its 47 us launch took more GPU
    # time than torch's 18 us of kernels)
    triton_projection: bool = False
    # a = cast(silu(temb)) made by `gemm.silu_cast` (one Triton launch, silu in fp32 and one rounding to W's
    # dtype) instead of torch's F.silu and .to, whose aten::silu took ~150 us of host a call under
    # torch.profiler on a slow-host H200 VM; with it the net fwd+bwd at S = 32768 was 718.0 / 670.7 us sync /
    # stream against 851.7 / 647.7 (H200, commit 3c77436: the stream figures within one round's jitter). For
    # a bf16/fp16 temb torch rounds silu to temb's dtype first: here only once. (With triton_projection the
    # gemm launch fuses the silu itself and this is not used.)
    triton_silu: bool = True
    # the projection's backward as two launches of kernels/gemm.py (`PROJECTION_DX`, `PROJECTION_DW`)
    # instead of torch's five calls (mm, cast, silu_backward, mm, sum), ~220 us of host a step under the
    # profiler on a slow-host VM: H200, commit cf0e3c2, net fwd+bwd 3-4% faster at S = 4097 in two runs,
    # equal at S = 32768 (779.9 / 639.8 us against 806.2 / 638.9); on a slower host (commit e56dc3f) 894.0 /
    # 834.4 against 904.6 / 876.9. dtemb keeps dproj W in fp32 up to its one rounding (torch's path rounds it
    # to W's dtype first), so its bits differ from torch's. (With projection_node=False autograd's
    # composition makes that backward: not used.)
    triton_grads: bool = True
    # the whole op as ONE autograd node (`_FinalAdaLNOut`): the projection, then norm_modulate's launchers
    # called directly (no second argument check, no chunk views, no second node, no torch.cat of dshift
    # and dscale: the backward writes them into the halves of one dproj buffer). The same kernels in the
    # same order, so the same bits; fewer host operations per forward+backward: H200, commit c7acaa3, net
    # fwd+bwd stream 1043.2 us against 1528.4 with two nodes, host per step 1308.0 against 1442.9 (both
    # host-bound)
    one_node: bool = True

    def __post_init__(self):
        if self.triton_projection and not self.projection_node:
            raise ValueError("triton_projection needs projection_node: the Triton forward's backward lives there")
        if self.one_node and not self.projection_node:
            raise ValueError("one_node needs projection_node: the projection is part of the one node "
                             "(LaunchConfig(projection_node=False, one_node=False) for autograd's composition)")


# One config whatever T is: the projection's input has T rows for every batch, so its order never
# depends on S. 16-row tiles (mma.sync) for T = 3: 2H / 64 programs stream W.
PROJECTION_GEMM = gemm.LaunchConfig(16, 64, 64, num_warps=4, num_stages=4)
# `triton_grads`, likewise one config each for every T: dtemb = (dproj W) silu'(temb) sums over 2H in 4
# fixed split-K chunks (D / 64 x 4 programs stream W: 168 at D = 2688); dW = dproj^T a (K = T) and db (its
# ones column) in 64 x 128 tiles, each element one chain over t = 0, 1, ... (gemm.weight_grad).
PROJECTION_DX = gemm.LaunchConfig(16, 64, 64, num_warps=4, num_stages=4, split_k=4)
PROJECTION_DW = gemm.LaunchConfig(64, 128, 16, num_warps=4, num_stages=3)


@functools.lru_cache(maxsize=64)
def launch_config(hidden: int) -> LaunchConfig:
    return LaunchConfig()


def _unit_inner(temb):
    """temb with unit inner stride, as `gemm.forward`'s A and `gemm.silu_cast`'s input need it."""
    return temb if temb.stride(-1) == 1 else temb.contiguous()


def _triton_projection(temb, w, b):
    """F.linear(silu(temb).to(w.dtype), w, b) in one launch: silu in fp32 and one rounding to w's dtype as
    the GEMM loads temb (unit inner stride), fp32 accumulation, + b, one rounding."""
    return gemm.forward(temb, w, b, PROJECTION_GEMM, out_dtype=w.dtype, a_silu=True)[0]


# how the projection's forward runs (`projection_kind`): torch's silu, cast and F.linear; our silu_cast
# then F.linear; or one gemm launch with the silu fused
TORCH, SILU_CAST, GEMM = "torch", "silu_cast", "gemm"


def projection_kind(cfg: LaunchConfig) -> str:
    return GEMM if cfg.triton_projection else SILU_CAST if cfg.triton_silu else TORCH


def grads_kind(cfg: LaunchConfig) -> str:
    """How the projection's backward runs: torch's calls (TORCH) or two gemm launches (GEMM)."""
    return GEMM if cfg.triton_grads else TORCH


def _project(temb, w, b, kind):
    """(temb as the backward reads it, a = cast(silu(temb)) or None, proj) by `kind` (above); for GEMM
    and SILU_CAST temb is made unit-stride once (gemm.silu_cast's input; the backward reads it), for TORCH
    contiguous."""
    if kind == GEMM:
        temb = _unit_inner(temb)
        return temb, None, _triton_projection(temb, w, b)
    if kind == SILU_CAST:
        temb = _unit_inner(temb)
        a = gemm.silu_cast(temb, w.dtype)
    else:
        # torch's elementwise CPU kernels take a vector path over contiguous runs and a scalar one for the
        # rest, with other bits (silu_backward on a row-gapped temb, AMD EPYC): torch gets temb contiguous
        temb = temb.contiguous()
        a = F.silu(temb).to(w.dtype)
    # and a contiguous W (a no-op for the usual parameter): a BLAS may take another path for a strided one
    return temb, a, F.linear(a, w.contiguous(), b)


def _projection_grads(dproj, temb, a, w, need_temb, need_w, need_b, grads=TORCH):
    """(dtemb, dW, db) of proj = F.linear(cast(silu(temb)), W, b) from a contiguous dproj, each a fixed-shape
    call independent of S: dW = dproj^T a (a made again by `gemm.silu_cast` when the forward fused
    it: the same fp32 silu and rounding), db = the sum of dproj's T rows, dtemb = silu'(temb) (dproj W).
    `grads` GEMM: two gemm launches (`LaunchConfig.triton_grads`), else torch's calls."""
    dtemb = dw = db = None
    if grads == GEMM:
        if need_temb:
            dtemb = gemm.input_grad(dproj, w, PROJECTION_DX, dsilu_of=temb, out_dtype=temb.dtype)
        if need_w or need_b:
            dw, db = gemm.weight_grad(dproj, a if a is not None else gemm.silu_cast(temb, w.dtype), PROJECTION_DW,
                                      dw_dtype=w.dtype, db_dtype=w.dtype if need_b else None)
        return dtemb, (dw if need_w else None), db
    if need_w:
        dw = dproj.t().mm(a if a is not None else gemm.silu_cast(temb, w.dtype))
    if need_b:
        db = dproj.sum(0)
    if need_temb:
        # as autograd's ToCopyBackward + SiluBackward: the bf16 product cast up, then silu' in temb's dtype
        dtemb = torch.ops.aten.silu_backward(dproj.mm(w.contiguous()).to(temb.dtype), temb)  # W as above
    return dtemb, dw, db


class _Projection(torch.autograd.Function):
    """proj = F.linear(silu(temb).to(W.dtype), W, b) as one node (`_project`, `_projection_grads`)."""

    @staticmethod
    def forward(ctx, temb, w, b, kind=TORCH, grads=TORCH):
        temb, a, proj = _project(temb, w, b, kind)
        ctx.save_for_backward(temb, w)
        ctx.a = a  # an intermediate (no version check), None with the Triton forward
        ctx.grads = grads
        return proj

    @staticmethod
    def backward(ctx, dproj):
        temb, w = ctx.saved_tensors
        return (*_projection_grads(dproj.contiguous(), temb, ctx.a, w, *ctx.needs_input_grad[:3], ctx.grads),
                None, None)


def _one_node_forward(x, nw, temb, w, b, ti, eps, kind, training):
    """The projection, then norm_modulate's forward launcher on the rows (arguments already checked by
    `_check`). Returns (out, temb as the backward needs it, a or None, x2d, nw, ti1d, sc view, rstd, plan,
    norm_modulate config). The same calls as the two-node path: `_project`, norm_modulate_api's row
    layout (`as_rows`), plan rule (`global_plan`) and launch. shift is passed as the whole [T, 2H]
    projection (row stride 2H: the kernel reads its first H columns), scale as the view of its second half."""
    temb, a, proj = _project(temb, w, b, kind)
    hidden = x.shape[-1]
    x2d, nw, proj, sc, ti = as_rows(x, nw, proj, proj.narrow(1, hidden, hidden), ti)
    cfg = NM.launch_config(hidden)
    table_rows = proj.shape[0]
    plan = global_plan(ti, table_rows, cfg, training)
    y, rstd = NM.forward(x2d, nw, proj, sc, ti, eps, save_rstd=training, config=cfg, plan=plan)
    return (y if x.dim() == 2 else y.view(x.shape)), temb, a, x2d, nw, ti, sc, rstd, plan, cfg


class _FinalAdaLNOut(torch.autograd.Function):
    """The whole op as one autograd node (`LaunchConfig.one_node`). Backward: norm_modulate's backward
    launcher writes dshift and dscale into the two column halves of one [T, 2H] dproj buffer, then
    `_projection_grads` on it (as `_Projection.backward`; the buffer is contiguous already)."""

    @staticmethod
    def forward(ctx, x, nw, temb, w, b, ti, eps, kind, grads):
        y, temb, a, x2d, nw, ti, sc, rstd, plan, cfg = _one_node_forward(x, nw, temb, w, b, ti, eps, kind, True)
        ctx.save_for_backward(x2d, nw, ti, temb, w)
        # intermediates, not inputs or outputs: no version check needed
        ctx.a, ctx.sc, ctx.rstd, ctx.plan, ctx.cfg, ctx.x_shape = a, sc, rstd, plan, cfg, x.shape
        ctx.grads = grads
        return y

    @staticmethod
    def backward(ctx, dy):
        x2d, nw, ti, temb, w = ctx.saved_tensors
        need_x, need_nw, need_temb, need_w, need_b = ctx.needs_input_grad[:5]
        hidden = x2d.shape[1]
        dy2d = dy if dy.dim() == 2 else dy.reshape(-1, hidden)
        if dy2d.stride(-1) != 1 or (dy2d.shape[0] > 1 and dy2d.stride(0) == 0):
            dy2d = dy2d.contiguous()
        sc = ctx.sc
        need_proj = need_temb or need_w or need_b
        if need_proj:
            dproj = w.new_empty((sc.shape[0], 2 * hidden))  # [dshift | dscale], in the projection's dtype
            out = (dproj, dproj.narrow(1, hidden, hidden))
        else:
            out = None
        dx, dnw, _, _ = NM.backward(dy2d, x2d, nw, sc, ti, ctx.rstd, sc.shape[0], sc.dtype, need_nw or need_proj,
                                    ctx.cfg, ctx.plan, out=out)
        if need_x and len(ctx.x_shape) != 2:
            dx = dx.view(ctx.x_shape)
        dtemb, dw, db = (_projection_grads(dproj, temb, ctx.a, w, need_temb, need_w, need_b, ctx.grads)
                         if need_proj else (None, None, None))
        return dx if need_x else None, dnw if need_nw else None, dtemb, dw, db, None, None, None, None


def _one_node(x, nw, temb, w, b, ti, eps, kind, grads):
    if torch.is_grad_enabled() and (x.requires_grad or nw.requires_grad or temb.requires_grad or w.requires_grad
                                    or b.requires_grad):
        return _FinalAdaLNOut.apply(x, nw, temb, w, b, ti, eps, kind, grads)
    return _one_node_forward(x, nw, temb, w, b, ti, eps, kind, False)[0]


def _projection_autograd(temb, w, b):
    return F.linear(F.silu(temb).to(w.dtype), w, b)


def _well_formed(x, nw, temb, w, b, ti, device: int) -> bool:
    """What `_check` accepts, as one predicate of attribute reads for the common case (every tensor's
    get_device() is `device`, ti one entry per row of x flat): True only where `_check` passes; False
    sends the call through `_check`, which raises naming the argument, or accepts what this does not
    cover (ti shaped like x's leading dims, zero rows with no timesteps)."""
    try:
        hidden = x.shape[-1]
        return (nw.get_device() == device and temb.get_device() == device and w.get_device() == device
                and b.get_device() == device and ti.get_device() == device and x.get_device() == device
                and x.dtype in checks.FLOATS and nw.dtype in checks.FLOATS and w.dtype in checks.FLOATS
                and b.dtype == w.dtype
                and temb.dtype in checks.FLOATS and ti.dtype in checks.INDEX
                and 0 < hidden <= NM.MAX_HIDDEN and nw.dim() == 1 and nw.shape[0] == hidden
                and temb.dim() == 2 and temb.shape[0] > 0 and temb.shape[1] > 0
                and w.dim() == 2 and w.shape[0] == 2 * hidden and w.shape[1] == temb.shape[1]
                and b.dim() == 1 and b.shape[0] == 2 * hidden and ti.dim() == 1 and ti.shape[0] * hidden == x.numel())
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return False


def _fast_ok(x, nw, temb, w, b, ti) -> bool:
    """Every argument well formed and all on one CUDA device (one predicate: the host path is what the
    H200 timeline is short of)."""
    try:
        return (x.is_cuda and nw.is_cuda and temb.is_cuda and w.is_cuda and b.is_cuda and ti.is_cuda
                and _well_formed(x, nw, temb, w, b, ti, x.get_device()))
    except AttributeError:
        return False


def _check(x, nw, temb, w, b, ti) -> None:
    named = {"x": x, "nw": nw, "temb": temb, "w": w, "b": b, "ti": ti}
    checks.tensors(named)
    checks.same_device(named, "x")
    checks.triton_device("x", x)
    for name in ("x", "nw", "w", "temb"):  # each its own float dtype (b goes with w: F.linear's bias)
        checks.float_dtype(name, named[name])
    checks.same_dtype(named, ("b",), "w")
    checks.index_dtype("ti", ti)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must be [..., H] with H >= 1, got shape {tuple(x.shape)}")
    hidden = x.shape[-1]
    if nw.shape != (hidden,):
        raise ValueError(f"nw must have shape ({hidden},) to match x's last dimension, got {tuple(nw.shape)}")
    if temb.dim() != 2 or temb.shape[1] < 1:
        raise ValueError(f"temb must be [T, D] with D >= 1, got shape {tuple(temb.shape)}")
    steps, dim = temb.shape
    if w.shape != (2 * hidden, dim):
        raise ValueError(f"w must have shape ({2 * hidden}, {dim}) (2H x temb's D), got {tuple(w.shape)}")
    if b.shape != (2 * hidden,):
        raise ValueError(f"b must have shape ({2 * hidden},), got {tuple(b.shape)}")
    rows = x.numel() // hidden
    if ti.shape != x.shape[:-1] and ti.shape != (rows,):
        raise ValueError(f"ti must have shape {tuple(x.shape[:-1])} (one entry per row of x), got {tuple(ti.shape)}")
    if rows and steps == 0:
        raise ValueError("temb has no rows (timesteps), so no ti can be valid")
    if hidden > NM.MAX_HIDDEN:  # norm_modulate's bound (the one-node path calls its launchers unchecked)
        raise ValueError(f"x has H = {hidden}; this kernel supports H <= {NM.MAX_HIDDEN}")


def final_adaln_out(x: torch.Tensor, nw: torch.Tensor, temb: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                    ti: torch.Tensor, eps: float = 1e-5, check_index: bool = True,
                    config: Optional[LaunchConfig] = None) -> torch.Tensor:
    """rms_norm(x, nw, eps) * (1 + scale[ti]) + shift[ti], [shift | scale] = F.linear(silu(temb).to(w.dtype), w, b).

    x: [..., H]; nw: [H]; w: [2H, D]; b: [2H] in w's dtype; temb: [T, D]; x, nw, w and temb each bf16, fp16
    or fp32 independently (the model: bf16, fp32 temb); ti: one int32/int64 entry per row of x, in [0, T).
    out comes in x's dtype (norm_modulate's rule), shift and scale in w's; gradients for x, nw, temb, w
    and b, each in its input's dtype. `check_index=False` skips the range check (a host sync); a row whose ti is out
    of range then comes out as NaN and adds nothing to the parameter gradients.
    """
    if not _fast_ok(x, nw, temb, w, b, ti):
        _check(x, nw, temb, w, b, ti)
    if not (type(eps) is float and 0.0 <= eps < checks.INF):  # the common case inline: this runs every call
        eps = checks.epsilon(eps)
    if check_index:
        checks.index_range("ti", ti, temb.shape[0], rows_of="temb")
    cfg = config or launch_config(x.shape[-1])
    if cfg.one_node:
        if x.is_cuda and x.get_device() != torch.cuda.current_device():
            with torch.cuda.device(x.device):  # triton launches on the current device
                return _one_node(x, nw, temb, w, b, ti, eps, projection_kind(cfg), grads_kind(cfg))
        return _one_node(x, nw, temb, w, b, ti, eps, projection_kind(cfg), grads_kind(cfg))
    wants_grad = torch.is_grad_enabled() and (temb.requires_grad or w.requires_grad or b.requires_grad)
    if cfg.projection_node and wants_grad:
        proj = _Projection.apply(temb, w, b, projection_kind(cfg), grads_kind(cfg))
    elif cfg.projection_node:  # no gradient is wanted here
        proj = _project(temb, w, b, projection_kind(cfg))[2]
    else:
        proj = _projection_autograd(temb, w, b)
    shift, scale = proj.chunk(2, dim=-1)
    ti = ti if ti.is_contiguous() else ti.contiguous()  # norm_modulate reads the index with unit stride
    return norm_modulate(x, nw, shift, scale, ti, eps, check_index=False)  # ti was checked above (or not asked)
