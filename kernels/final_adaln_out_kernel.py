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

The whole op is one autograd node (`final_adaln_out_api._FinalAdaLNOut`) whose forward runs the projection (a =
`gemm.silu_cast(temb)`: silu in fp32 and one rounding to W's dtype, then F.linear) and then norm_modulate's
forward launcher directly (the arguments were checked here once; shift is passed as the whole [T, 2H]
projection, whose row stride the kernel takes, scale as a view of its second half), and whose backward has
norm_modulate's backward launcher write dshift and dscale straight into the halves of one [T, 2H] dproj
buffer (no torch.cat), then runs the projection's backward as two kernels/gemm.py launches. At S = 32768 a
forward+backward is host-bound on the GPU machines measured (kernels/notes/final_adaln_out.md): each of these choices
removes host work, not GPU work; the notes list the alternatives measured against them.
"""
from __future__ import annotations

import torch.nn.functional as F

from h3bench.kernels import gemm
from h3bench.kernels import norm_modulate_kernel as NM
from h3bench.kernels.norm_modulate_api import as_rows, global_plan


# One config each for every T: the projection's input has T rows for every batch, so its order never
# depends on S. dtemb = (dproj W) silu'(temb) sums over 2H in 4 fixed split-K chunks (D / 64 x 4 programs
# stream W: 168 at D = 2688); dW = dproj^T a (K = T) and db (its ones column) in 64 x 128 tiles, each
# element one chain over t = 0, 1, ... (gemm.weight_grad).
PROJECTION_DX = gemm.LaunchConfig(16, 64, 64, num_warps=4, num_stages=4, split_k=4)
PROJECTION_DW = gemm.LaunchConfig(64, 128, 16, num_warps=4, num_stages=3)


def temb_rows(temb):
    """temb as the projection and its backward read it: unit inner stride."""
    return temb if temb.stride(-1) == 1 else temb.contiguous()


def _project(temb, w, b):
    """(temb as the backward reads it, a = cast(silu(temb)), proj): temb made unit-stride once
    (gemm.silu_cast's input; the backward reads it), a by `gemm.silu_cast` (one launch: silu in fp32 and one
    rounding to w's dtype; for a bf16/fp16 temb torch would round silu to temb's dtype first), then F.linear."""
    temb = temb_rows(temb)
    a = gemm.silu_cast(temb, w.dtype)
    # and a contiguous W (a no-op for the usual parameter): a BLAS may take another path for a strided one
    return temb, a, F.linear(a, w.contiguous(), b)


def _projection_grads(dproj, temb, a, w, need_temb, need_w, need_b):
    """(dtemb, dW, db) of proj = F.linear(cast(silu(temb)), W, b) from a contiguous dproj, each a fixed-shape
    gemm launch independent of S: dtemb = silu'(temb) (dproj W) (`PROJECTION_DX`: dproj W kept in fp32 up
    to its one rounding), dW = dproj^T a and db = the sum of dproj's T rows (`PROJECTION_DW`)."""
    dtemb = dw = db = None
    if need_temb:
        dtemb = gemm.input_grad(dproj, w, PROJECTION_DX, dsilu_of=temb, out_dtype=temb.dtype)
    if need_w or need_b:
        dw, db = gemm.weight_grad(dproj, a, PROJECTION_DW, dw_dtype=w.dtype, db_dtype=w.dtype if need_b else None)
    return dtemb, (dw if need_w else None), db


def forward(x, nw, temb, w, b, ti, eps, training):
    """The projection, then norm_modulate's forward launcher on the rows (arguments already checked by
    `final_adaln_out_api._check`). Returns (out, temb as the backward needs it, a, x2d, nw, ti1d, sc view, rstd, plan,
    norm_modulate config). norm_modulate_api's row layout (`as_rows`), plan rule (`global_plan`) and launch;
    shift is passed as the whole [T, 2H] projection (row stride 2H: the kernel reads its first H columns),
    scale as the view of its second half."""
    temb, a, proj = _project(temb, w, b)
    hidden = x.shape[-1]
    x2d, nw, proj, sc, ti = as_rows(x, nw, proj, proj.narrow(1, hidden, hidden), ti)
    cfg = NM.launch_config(hidden)
    table_rows = proj.shape[0]
    plan = global_plan(ti, table_rows, cfg, training)
    y, rstd = NM.forward(x2d, nw, proj, sc, ti, eps, save_rstd=training, config=cfg, plan=plan)
    return (y if x.dim() == 2 else y.view(x.shape)), temb, a, x2d, nw, ti, sc, rstd, plan, cfg


def backward(dy, x2d, nw, ti, temb, w, a, sc, rstd, plan, cfg, x_shape, need_x: bool, need_nw: bool,
             need_temb: bool, need_w: bool, need_b: bool):
    """(dx, dnw, dtemb, dW, db), None where not needed, from what `forward(training=True)` returned:
    norm_modulate's backward launcher writes dshift and dscale into the two column halves of one [T, 2H]
    dproj buffer, then `_projection_grads` on it."""
    hidden = x2d.shape[1]
    dy2d = dy if dy.dim() == 2 else dy.reshape(-1, hidden)
    if dy2d.stride(-1) != 1 or (dy2d.shape[0] > 1 and dy2d.stride(0) == 0):
        dy2d = dy2d.contiguous()
    need_proj = need_temb or need_w or need_b
    if need_proj:
        dproj = w.new_empty((sc.shape[0], 2 * hidden))  # [dshift | dscale], in the projection's dtype
        out = (dproj, dproj.narrow(1, hidden, hidden))
    else:
        out = None
    dx, dnw, _, _ = NM.backward(dy2d, x2d, nw, sc, ti, rstd, sc.shape[0], sc.dtype, need_nw or need_proj, cfg, plan,
                                out=out)
    if need_x and len(x_shape) != 2:
        dx = dx.view(x_shape)
    dtemb, dw, db = (_projection_grads(dproj, temb, a, w, need_temb, need_w, need_b)
                     if need_proj else (None, None, None))
    return dx if need_x else None, dnw if need_nw else None, dtemb, dw, db
