"""`adaln_projection(temb, w, b)`: argument checks and autograd around kernels/adaln_projection_kernel.py (the
GEMMs' launch configurations, forward and backward)."""
from __future__ import annotations

import torch

from h3bench.kernels import adaln_projection_kernel as K
from h3bench.kernels import checks


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
    _check(temb, w, b)
    if temb.device.type == "cuda" and temb.device.index != torch.cuda.current_device():
        with torch.cuda.device(temb.device):
            return adaln_projection(temb, w, b)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (temb, w, b)):
        return _AdaLNProjection.apply(temb, w, b)
    return K.forward(temb, w, b, keep_a=False)[0]
