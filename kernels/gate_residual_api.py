"""`gate_residual(res, y, gate, idx)`: argument checks and autograd around kernels/gate_residual_kernel.py, and the
custom ops torch.compile captures (kernels/custom_ops.py)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from h3bench.kernels import checks
from h3bench.kernels import gate_residual_kernel as K
from h3bench.kernels.custom_ops import Record, compiling, config_fields, config_of, needed, on_device, present


def _check(res, y, gate, idx) -> None:
    named = {"res": res, "y": y, "gate": gate, "idx": idx}
    checks.tensors(named)
    checks.same_device(named, "res")
    checks.triton_device("res", res)
    for name in ("res", "y", "gate"):  # each its own float dtype (a DiT's fp32 residual stream, bf16 branch)
        checks.float_dtype(name, named[name])
    checks.index_dtype("idx", idx)
    if res.dim() < 1 or res.shape[-1] < 1:
        raise ValueError(f"res must be [..., H] with H >= 1, got shape {tuple(res.shape)}")
    if y.shape != res.shape:
        raise ValueError(f"y must have the shape of res {tuple(res.shape)}, got {tuple(y.shape)}")
    hidden = res.shape[-1]
    if gate.dim() != 2 or gate.shape[1] != hidden:
        raise ValueError(f"gate must have shape [M, {hidden}], got {tuple(gate.shape)}")
    rows = res.numel() // hidden
    if idx.shape != res.shape[:-1] and idx.shape != (rows,):
        raise ValueError(f"idx must have shape {tuple(res.shape[:-1])} (one entry per row of res), "
                         f"got {tuple(idx.shape)}")
    if rows and gate.shape[0] == 0:
        raise ValueError("gate has no table rows, so no index can be valid")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[R, H] with a unit inner stride; row-strided views pass uncopied."""
    t2 = t if t.dim() == 2 else t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 or t2.numel() == 0 else t2.contiguous()


def _layout(res, y, gate, idx):
    idx1 = idx if idx.dim() == 1 else idx.reshape(-1)
    return _rows(res), _rows(y), gate if gate.stride(-1) == 1 else gate.contiguous(), \
        idx1 if idx1.stride(0) == 1 else idx1.contiguous()


class _GateResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, res, y, gate, idx, config):
        res2, y2, gate_, idx1 = _layout(res, y, gate, idx)
        out = K.forward(res2, y2, gate_, idx1, config)
        ctx.save_for_backward(y2, gate_, idx1)
        ctx.shape, ctx.config, ctx.res_dtype = res.shape, config, res.dtype
        return out if res.dim() == 2 else out.view(res.shape)

    @staticmethod
    def backward(ctx, dout):
        y2, gate, idx = ctx.saved_tensors
        need_res, need_y, need_gate = ctx.needs_input_grad[:3]
        dy2 = _rows(dout)
        dres, dy, dgate = K.backward(dy2, y2, gate, idx, need_gate, ctx.config, res_dtype=ctx.res_dtype)
        if len(ctx.shape) != 2:
            dres, dy = dres.view(ctx.shape), dy.view(ctx.shape)
        return (dres if need_res else None, dy if need_y else None, dgate if need_gate else None, None, None)


def gate_residual(res: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, idx: torch.Tensor,
                  check_index: bool = True, config: Optional[K.LaunchConfig] = None) -> torch.Tensor:
    """res + gate[idx] * y, with gradients for res, y and gate.

    res, y: [..., H]; gate: [M, H] with any row stride (an AdaLN table chunk passes uncopied); idx: one
    int32/int64 entry per row, in [0, M). res, y and gate are each bf16, fp16 or fp32, independently: out
    comes in their promoted dtype (as `res + gate[idx] * y` in torch), each gradient in its input's dtype.
    fp32 inside, one rounding per output; the gate gradient is summed in a fixed order without atomics.
    `check_index=False` skips the range check (a host sync); a row with an index out of range then
    comes out as NaN (and its y gradient too) and adds nothing to the gate gradient.
    """
    if compiling():  # torch.compile captures the custom ops (below)
        return _traced(res, y, gate, idx, check_index, config)
    _check(res, y, gate, idx)
    if res.device.type == "cuda" and res.device.index != torch.cuda.current_device():
        with torch.cuda.device(res.device):  # triton launches on the current device
            return gate_residual(res, y, gate, idx, check_index, config)
    if check_index:
        checks.index_range("idx", idx, gate.shape[0], rows_of="gate")
    if torch.is_grad_enabled() and (res.requires_grad or y.requires_grad or gate.requires_grad):
        return _GateResidual.apply(res, y, gate, idx, config)
    out = K.forward(*_layout(res, y, gate, idx), config)
    return out if res.dim() == 2 else out.view(res.shape)


# --- the custom ops torch.compile captures (kernels/custom_ops.py) ----------------------------------------

def _traced(res: Tensor, y: Tensor, gate: Tensor, idx: Tensor, check_index: bool = True,
            config: Optional[K.LaunchConfig] = None) -> Tensor:
    """The call as a traced graph holds it: the forward op."""
    return _op(res, y, gate, idx, check_index, config_fields(config))


@torch.library.custom_op("h3bench::gate_residual", mutates_args=())
def _op(res: Tensor, y: Tensor, gate: Tensor, idx: Tensor, check_index: bool, config: list[int]) -> Tensor:
    """The eager call on detached inputs (its forward launch is the autograd node's); config: `config_fields`."""
    return gate_residual(res.detach(), y.detach(), gate.detach(), idx, check_index, config_of(K.LaunchConfig, config))


@_op.register_fake
def _fake(res, y, gate, idx, check_index, config):
    _check(res, y, gate, idx)
    out = res.new_empty(res.numel() // res.shape[-1], res.shape[-1], dtype=K.out_dtype(res, y, gate))
    return out if res.dim() == 2 else out.view(res.shape)


@torch.library.custom_op("h3bench::gate_residual_backward", mutates_args=())
def _backward_op(dout: Tensor, res: Tensor, y: Tensor, gate: Tensor, idx: Tensor, config: list[int],
                 needs: list[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """(dres, dy, dgate), each empty where `needs` has no gradient: `_GateResidual.backward` on the ctx its
    forward filled, made again from the inputs."""
    _, y2, gate_, idx1 = _layout(res, y, gate, idx)
    ctx = Record((y2, gate_, idx1), needs, shape=res.shape, config=config_of(K.LaunchConfig, config),
                 res_dtype=res.dtype)
    with on_device(res):
        return present(_GateResidual.backward(ctx, dout)[:3], res)


@_backward_op.register_fake
def _backward_fake(dout, res, y, gate, idx, config, needs):
    rows, hidden = res.numel() // res.shape[-1], res.shape[-1]
    grads = (res.new_empty(rows, hidden), y.new_empty(rows, hidden), gate.new_empty(gate.shape[0], hidden))
    if res.dim() != 2:
        grads = (grads[0].view(res.shape), grads[1].view(res.shape), grads[2])
    return present(needed(grads, needs), res)


def _setup(ctx, inputs, output) -> None:
    res, y, gate, idx, _, ctx.config = inputs
    ctx.save_for_backward(res, y, gate, idx)


def _backward(ctx, dout):
    needs = list(ctx.needs_input_grad[:3])
    return (*needed(_backward_op(dout, *ctx.saved_tensors, ctx.config, needs), needs), None, None, None)


_op.register_autograd(_backward, setup_context=_setup)
