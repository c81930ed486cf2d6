"""`norm_modulate(x, w, sh, sc, idx)`: argument checks and autograd around the Triton kernels, and the custom ops
torch.compile captures (kernels/custom_ops.py).

The host path is kept short on purpose: on the GPU machines measured a call's Python costs as much as a
small kernel (kernels/notes/norm_modulate.md, "Host path"). A call whose arguments are all well formed on one
CUDA device passes one predicate of attribute reads (`_fast_ok`); only when that fails do the detailed
checks run, to name the argument at fault in the error.
"""
from __future__ import annotations

import torch
from torch import Tensor

from h3bench.kernels import checks, graph_cache
from h3bench.kernels import norm_modulate_kernel as K
from h3bench.kernels.custom_ops import Record, absent, compiling, needed, on_device, present, require_training


def _fast_ok(x, w, sh, sc, idx) -> bool:
    """Every argument well formed, all on the same CUDA device, or all on the CPU under the interpreter
    (the common cases, checked cheaply: the CPU case so the tests and tools/hostcost_cpu.py take the
    path a GPU call takes). False sends the call through `_check`, which raises naming the argument, or
    accepts what this one does not cover (other devices under the interpreter, zero rows with an empty
    table, idx shaped like x's leading dims). True only where `_check` passes (tests/test_kernel.py)."""
    try:
        hidden = x.shape[-1]
        device = x.get_device()
        if device >= 0:
            same = (x.is_cuda and w.is_cuda and sh.is_cuda and sc.is_cuda and idx.is_cuda
                    and w.get_device() == device and sh.get_device() == device and sc.get_device() == device
                    and idx.get_device() == device)
        else:  # `_check` takes CPU tensors under the interpreter only
            same = (x.is_cpu and w.is_cpu and sh.is_cpu and sc.is_cpu and idx.is_cpu
                    and checks.interpreter_active())
        return (same
                and x.dtype in checks.FLOATS and w.dtype in checks.FLOATS and sh.dtype in checks.FLOATS
                and sc.dtype in checks.FLOATS and idx.dtype in checks.INDEX
                and 0 < hidden <= K.MAX_HIDDEN and w.dim() == 1 and w.shape[0] == hidden
                and sh.dim() == 2 and sc.dim() == 2 and sh.shape[1] == hidden and sc.shape[1] == hidden
                and 0 < sh.shape[0] == sc.shape[0] and idx.dim() == 1 and idx.shape[0] * hidden == x.numel())
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return False


def _check(x, w, sh, sc, idx) -> None:
    named = {"x": x, "w": w, "sh": sh, "sc": sc, "idx": idx}
    checks.tensors(named)
    checks.same_device(named, "x")
    checks.triton_device("x", x, any_device_interpreted=True)
    for name in ("x", "w", "sh", "sc"):  # each its own float dtype: fp32 math, each gradient in its input's dtype
        checks.float_dtype(name, named[name])
    checks.index_dtype("idx", idx)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must be [..., H] with H >= 1, got shape {tuple(x.shape)}")
    hidden = x.shape[-1]
    if hidden > K.MAX_HIDDEN:
        raise ValueError(f"x has H = {hidden}; this kernel supports H <= {K.MAX_HIDDEN}")
    if w.shape != (hidden,):
        raise ValueError(f"w must have shape ({hidden},) to match x's last dimension, got {tuple(w.shape)}")
    for name in ("sh", "sc"):
        t = named[name]
        if t.dim() != 2 or t.shape[1] != hidden:
            raise ValueError(f"{name} must have shape [M, {hidden}], got {tuple(t.shape)}")
    if sh.shape[0] != sc.shape[0]:
        raise ValueError(f"sh and sc must have the same number of table rows, got {sh.shape[0]} and {sc.shape[0]}")
    rows = x.numel() // hidden
    if idx.shape != x.shape[:-1] and idx.shape != (rows,):
        raise ValueError(f"idx must have shape {tuple(x.shape[:-1])} (one entry per row of x), "
                         f"got {tuple(idx.shape)}")
    if rows and sh.shape[0] == 0:
        raise ValueError("sh and sc have no table rows, so no index can be valid")


def _unit_inner(t: torch.Tensor) -> torch.Tensor:
    """Row-strided views (AdaLN table chunks) pass as they are; anything else is made contiguous."""
    return t if t.stride()[-1] == 1 or t.numel() == 0 else t.contiguous()


def as_rows(x, w, sh, sc, idx):
    """The launchers' layout: x as [R, H] rows, idx flat, unit inner strides. No tensor call where the
    caller already passes rows (each costs host time: kernels/notes/norm_modulate.md, "Host path").
    (`t.stride()[i]`, not `t.stride(i)`: the argument parser makes the latter dearer.)"""
    x2d = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    return (_unit_inner(x2d), w if w.stride()[0] == 1 else w.contiguous(), _unit_inner(sh), _unit_inner(sc),
            idx if idx.dim() == 1 and idx.stride()[0] == 1 else idx.reshape(-1).contiguous())


def global_plan(idx1d, table_rows: int, cfg, training: bool):
    """The global plan (rows sorted once by table row) when M > local_max, else None: always when a
    backward will follow (the forward and the backward share it), for inference when the forward walks
    it (`K.wants_plan`)."""
    if K.wants_plan(table_rows, training, cfg):
        return K.make_plan(idx1d, table_rows)
    return None


class _NormModulate(torch.autograd.Function):
    # The host path is kept short on purpose: the backward is host-bound at small sizes, and each tensor
    # call or saved tensor costs host time (kernels/notes/norm_modulate.md, "Host path").
    @staticmethod
    def forward(ctx, x, w, sh, sc, idx, eps):
        x2d, w_, sh_, sc_, idx1d = as_rows(x, w, sh, sc, idx)
        cfg = K.launch_config(x2d.shape[1])
        table_rows = sh.shape[0]
        plan = global_plan(idx1d, table_rows, cfg, training=True)
        y, rstd = K.forward(x2d, w_, sh_, sc_, idx1d, eps, config=cfg, plan=plan)
        ctx.save_for_backward(x2d, w_, sc_, idx1d)
        # intermediates, not inputs or outputs (no version check), as one attribute: one ctx write, one read
        ctx.state = (rstd, plan, cfg, table_rows, sh.dtype, None if x.dim() == 2 else x.shape)
        return y if x.dim() == 2 else y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2d, w, sc, idx = ctx.saved_tensors
        rstd, plan, cfg, table_rows, sh_dtype, x_shape = ctx.state
        need_x, need_w, need_sh, need_sc = ctx.needs_input_grad[:4]
        dy2d = dy if dy.dim() == 2 else dy.reshape(-1, x2d.shape[1])
        strides = dy2d.stride()
        if strides[-1] != 1 or (strides[0] == 0 and dy2d.shape[0] > 1):
            dy2d = dy2d.contiguous()
        dx, dw, dsh, dsc = K.backward(dy2d, x2d, w, sc, idx, rstd, table_rows, sh_dtype,
                                      need_w or need_sh or need_sc, cfg, plan)
        if need_x and x_shape is not None:
            dx = dx.view(x_shape)
        return (dx if need_x else None, dw if need_w else None, dsh if need_sh else None,
                dsc if need_sc else None, None, None)


def norm_modulate(x: torch.Tensor, w: torch.Tensor, sh: torch.Tensor, sc: torch.Tensor, idx: torch.Tensor,
                  eps: float = 1e-5, check_index: bool = True) -> torch.Tensor:
    """y = rms_norm(x, w, eps) * (1 + sc[idx]) + sh[idx], with gradients for x, w, sh and sc.

    x: [..., H] with H <= 32768; w: [H]; sh, sc: [M, H] with any row stride (AdaLN table chunks pass
    uncopied); idx: one int32/int64 entry per row of x, in [0, M), any M >= 1. x, w, sh and sc are each
    bf16, fp16 or fp32, independently: the arithmetic is fp32, y and x's gradient come out in x's
    dtype, and every other gradient in its own input's dtype. `check_index=False` skips the range check
    (a host sync); a row whose index is out of range then comes out as NaN (and its x gradient too),
    adding nothing to the parameter gradients, instead of raising.
    """
    if compiling():  # torch.compile captures the custom ops (below)
        return _traced(x, w, sh, sc, idx, eps, check_index)
    if not _fast_ok(x, w, sh, sc, idx):
        _check(x, w, sh, sc, idx)
    if not (type(eps) is float and 0.0 <= eps < checks.INF):  # the common case inline: this runs every call
        eps = checks.epsilon(eps)
    if x.is_cuda and x.get_device() != torch.cuda.current_device():
        with torch.cuda.device(x.device):  # triton launches on the current device
            return norm_modulate(x, w, sh, sc, idx, eps, check_index)
    if check_index:
        checks.index_range("idx", idx, sh.shape[0], rows_of="the table")
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or sh.requires_grad or sc.requires_grad):
        return _NormModulate.apply(x, w, sh, sc, idx, eps)
    # Inference: no autograd node and no saved rstd (each costs host time, the rstd store 5 us).
    x2d, w_, sh_, sc_, idx1d = as_rows(x, w, sh, sc, idx)
    cfg = K.launch_config(x2d.shape[1])
    plan = global_plan(idx1d, sh.shape[0], cfg, training=False)
    if plan is None and GRAPHS.usable(x2d):
        y = _replayed(x2d, w_, sh_, sc_, idx1d, eps, cfg)
    else:
        y, _ = K.forward(x2d, w_, sh_, sc_, idx1d, eps, save_rstd=False, config=cfg, plan=plan)
    return y if x.dim() == 2 else y.view(x.shape)


# The inference forward's launch as a CUDA graph (kernels/graph_cache.py), on unless H3BENCH_GRAPHS=0: a
# loop's calls with their tensors where the previous call's were replay it: less host time a call, with the
# same bits (kernels/notes/norm_modulate.md, "Host path", has the figures and the command). The graph
# holds the one launch and nothing else (y and every input come from outside: their addresses are the key).
GRAPHS = graph_cache.GraphCache(on_by_default=True)


def _replayed(x2d, w, sh, sc, idx, eps: float, cfg) -> torch.Tensor:
    """`K.forward(...)[0]` under the local plan, through `GRAPHS`: the key is everything the launch depends
    on besides the tensors' contents (the recipe's inputs, dtypes, strides, eps, device, stream and every
    address, y's included)."""
    y = torch.empty_like(x2d)
    key = (x2d.shape, x2d.stride()[0], sh.shape[0], sh.stride()[0], sc.stride()[0], x2d.dtype, w.dtype, sh.dtype,
           sc.dtype, idx.dtype, eps, cfg) + graph_cache.placed(x2d.get_device(), x2d, w, sh, sc, idx, y)
    GRAPHS.run(key, lambda: K.forward(x2d, w, sh, sc, idx, eps, save_rstd=False, config=cfg, out=y))
    return y


# --- the custom ops torch.compile captures (kernels/custom_ops.py) ----------------------------------------

def _traced(x: Tensor, w: Tensor, sh: Tensor, sc: Tensor, idx: Tensor, eps: float = 1e-5,
            check_index: bool = True) -> Tensor:
    """The call as a traced graph holds it: the forward op, in the mode the eager call would take."""
    training = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or sh.requires_grad
                                            or sc.requires_grad)
    return _op(x, w, sh, sc, idx, eps, check_index, training)[0]


@torch.library.custom_op("h3bench::norm_modulate", mutates_args=())
def _op(x: Tensor, w: Tensor, sh: Tensor, sc: Tensor, idx: Tensor, eps: float, check_index: bool,
        training: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
    """(y, rstd, the global plan or []): with `training` the eager autograd node's forward and what the
    backward op needs (rstd and the plan), else the eager call on detached inputs (the no-grad path; rstd
    empty)."""
    if not training:
        y = norm_modulate(x.detach(), w.detach(), sh.detach(), sc.detach(), idx, eps, check_index)
        return y, absent(x, torch.float32), []
    with on_device(x):
        if check_index:
            checks.index_range("idx", idx, sh.shape[0], rows_of="the table")
        ctx = Record()
        y = _NormModulate.forward(ctx, x, w, sh, sc, idx, eps)
    rstd, plan = ctx.state[:2]
    return y, rstd, list(plan or ())


@_op.register_fake
def _fake(x, w, sh, sc, idx, eps, check_index, training):
    _check(x, w, sh, sc, idx)
    checks.epsilon(eps)
    x2d = as_rows(x, w, sh, sc, idx)[0]
    y = torch.empty_like(x2d)
    y = y if x.dim() == 2 else y.view(x.shape)
    if not training:
        return y, absent(x, torch.float32), []
    rows = x2d.shape[0]
    plan = K.wants_plan(sh.shape[0], True, K.launch_config(int(x2d.shape[1])))
    return y, x.new_empty(rows, dtype=torch.float32), [idx.new_empty(rows, dtype=torch.int64) for _ in range(2 * plan)]



@torch.library.custom_op("h3bench::norm_modulate_backward", mutates_args=())
def _backward_op(dy: Tensor, x: Tensor, w: Tensor, sh: Tensor, sc: Tensor, idx: Tensor, rstd: Tensor,
                 plan: list[Tensor], needs: list[bool]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dw, dsh, dsc), each empty where `needs` has no gradient: `_NormModulate.backward` on the ctx its
    forward filled, made again from the inputs and the forward op's rstd and plan."""
    x2d, w_, _, sc_, idx1d = as_rows(x, w, sh, sc, idx)
    state = (rstd, tuple(plan) or None, K.launch_config(x2d.shape[1]), sh.shape[0], sh.dtype,
             None if x.dim() == 2 else x.shape)
    with on_device(x):
        grads = _NormModulate.backward(Record((x2d, w_, sc_, idx1d), needs, state=state), dy)
    return present(grads[:4], x)


@_backward_op.register_fake
def _backward_fake(dy, x, w, sh, sc, idx, rstd, plan, needs):
    x2d, w_, _, _, _ = as_rows(x, w, sh, sc, idx)
    rows, hidden = x2d.shape
    dx = x2d.new_empty(rows, hidden) if rows else torch.empty_like(x2d)
    dx = dx if x.dim() == 2 else dx.view(x.shape)
    tables = (x2d.new_empty(sh.shape[0], hidden, dtype=sh.dtype), x2d.new_empty(sc.shape[0], hidden, dtype=sc.dtype))
    return present(needed((dx, torch.empty_like(w_), *tables), needs), x)


def _setup(ctx, inputs, output) -> None:
    x, w, sh, sc, idx, _, _, ctx.training = inputs
    _, rstd, plan = output
    ctx.save_for_backward(x, w, sh, sc, idx, rstd, *plan)


def _backward(ctx, dy, *_):
    require_training(ctx, "norm_modulate")
    x, w, sh, sc, idx, rstd, *plan = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:4])
    return (*needed(_backward_op(dy, x, w, sh, sc, idx, rstd, plan, needs), needs), None, None, None, None)


_op.register_autograd(_backward, setup_context=_setup)
