"""`adaln_projection(temb, w, b)`: argument checks and autograd around kernels/adaln_projection_kernel.py (the
GEMMs' launch configurations, forward and backward), and the custom ops torch.compile captures
(kernels/custom_ops.py)."""
from __future__ import annotations

import torch
from torch import Tensor

from h3bench.kernels import adaln_projection_kernel as K
from h3bench.kernels import checks, gemm
from h3bench.kernels.custom_ops import Record, compiling, needed, on_device, present, require_training


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


class _AdaLNProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, temb, w, b):
        table, a = K.forward(temb, w, b, keep_a=True)
        ctx.save_for_backward(temb, w, a)
        return table

    @staticmethod
    def backward(ctx, dy):
        temb, w, a = ctx.saved_tensors
        return K.backward(dy, temb, w, a, *ctx.needs_input_grad[:3])


def adaln_projection(temb: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """table = W cast(silu(temb)) + b with gradients for temb, w and b.

    temb: [T, D] fp32 (bf16/fp16 accepted); w: [N, D] bf16 or fp16; b: [N] in w's dtype; one device
    (CUDA, or the CPU under TRITON_INTERPRET=1). Returns [T, N] in w's dtype. T = 0 gives an empty
    table and zero weight gradients. Each table row is bitwise the same whatever T is; dW and db
    repeat bitwise."""
    if compiling():  # torch.compile captures the custom ops (below)
        return _traced(temb, w, b)
    _check(temb, w, b)
    if temb.device.type == "cuda" and temb.device.index != torch.cuda.current_device():
        with torch.cuda.device(temb.device):
            return adaln_projection(temb, w, b)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (temb, w, b)):
        return _AdaLNProjection.apply(temb, w, b)
    return K.forward(temb, w, b, keep_a=False)[0]


# --- the custom ops torch.compile captures (kernels/custom_ops.py) ----------------------------------------

def _traced(temb: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """The call as a traced graph holds it: the forward op, in the mode the eager call would take."""
    training = torch.is_grad_enabled() and (temb.requires_grad or w.requires_grad or b.requires_grad)
    return _op(temb, w, b, training)[0]


@torch.library.custom_op("h3bench::adaln_projection", mutates_args=())
def _op(temb: Tensor, w: Tensor, b: Tensor, training: bool) -> tuple[Tensor, Tensor]:
    """(table, a's buffer): the eager call. a (cast(silu(temb))) is the first D columns of `gemm.silu_cast`'s
    buffer, which with `training` holds the ones column the backward op reads past them: the op returns the
    whole buffer, so that no graph keeps a while dropping what lies beyond its columns."""
    with on_device(temb):
        table, a = K.forward(temb, w, b, keep_a=training)
    return table, gemm.silu_cast_buffer(a)


@_op.register_fake
def _fake(temb, w, b, training):
    _check(temb, w, b)
    steps, dim = temb.shape
    buffer = temb.new_empty((steps, gemm.silu_cast_width(dim, training)), dtype=w.dtype)
    return temb.new_empty((steps, w.shape[0]), dtype=w.dtype), buffer


@torch.library.custom_op("h3bench::adaln_projection_backward", mutates_args=())
def _backward_op(dy: Tensor, temb: Tensor, w: Tensor, a_buffer: Tensor, needs: list[bool]
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """(dtemb, dW, db), each empty where `needs` has no gradient: `_AdaLNProjection.backward`."""
    a = a_buffer.narrow(1, 0, temb.shape[1])
    with on_device(temb):
        return present(_AdaLNProjection.backward(Record((temb, w, a), needs), dy), temb)


@_backward_op.register_fake
def _backward_fake(dy, temb, w, a_buffer, needs):
    grads = (temb.new_empty(temb.shape), w.new_empty(w.shape), w.new_empty(w.shape[0]))
    return present(needed(grads, needs), temb)


def _setup(ctx, inputs, output) -> None:
    temb, w, _, ctx.training = inputs
    ctx.save_for_backward(temb, w, output[1])


def _backward(ctx, dy, _):
    require_training(ctx, "adaln_projection")
    needs = list(ctx.needs_input_grad[:3])
    return (*needed(_backward_op(dy, *ctx.saved_tensors, needs), needs), None)


_op.register_autograd(_backward, setup_context=_setup)
