"""The negative control's planted fault: an op's composition whose rounding depends on the batch size.

A split-K GEMM or a chunked reduction picks its split from the number of rows, and with it how the partial
results round: a row's bits then depend on the batch it rides in, by an ULP or two. The control plants
that fault, small and known, into an honest composition (the op's composition row, `Op.composition_row`):

- forward: every output element is rounded by adding and then subtracting a power of two at the
  element's own magnitude, `(y + c) - c` in the output's dtype, which rounds away the element's lowest
  `rounding_bits(rows)` bits;
- backward: the gradient of every per-row input is rounded the same way (a custom autograd.Function), so
  the row gradients carry the fault as well.

The step is taken per element, relative to its magnitude, so tiny outputs keep their fault and zeros stay
zeros; an output that is already a multiple of both steps (an exact small integer, a power of two) cannot
differ, which is why `rounding_bits` changes the step by whole bits. A row alone rounds one bit away, any
batch of two or more rows two or three (by the batch size's parity): every comparison of a batch with a
row alone differs, and a full batch differs from its sub-batches of the other parity.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

FLOAT32_BIAS = 127
FLOAT32_MANTISSA_BITS = 23


def rounding_bits(rows: int) -> int:
    """How many low bits the planted fault rounds away in a batch of `rows` rows."""
    return 1 if rows == 1 else 2 + rows % 2


def round_low_bits(t: torch.Tensor, bits: int) -> torch.Tensor:
    """`t` with each element's lowest `bits` bits rounded away (to nearest, in `t`'s dtype): `(t + c) - c`
    with c = ±2^(exponent(t) + bits - 1), of `t`'s sign. Integers and non-finite values pass unchanged."""
    if not t.is_floating_point():
        return t
    wide = t.float()
    _, exponent = torch.frexp(wide)  # |t| < 2^exponent
    # the power of two built from its float32 bits: exact on every device, no libm in the way
    biased = (exponent + (bits - 1 + FLOAT32_BIAS)).clamp(1, 2 * FLOAT32_BIAS)
    step = (biased << FLOAT32_MANTISSA_BITS).view(torch.float32)
    step = torch.copysign(step, wide).to(t.dtype)
    rounded = (t + step) - step
    return torch.where(torch.isfinite(rounded), rounded, t)


class _RoundedForward(torch.autograd.Function):
    """The output rounded for the batch's size; its gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, bits: int) -> torch.Tensor:
        return round_low_bits(t, bits)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _RoundedGradient(torch.autograd.Function):
    """The identity, whose gradient is rounded for the batch's size."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, bits: int) -> torch.Tensor:
        ctx.bits = bits
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return round_low_bits(grad, ctx.bits), None


def planted(fn: Callable, per_row: Sequence[bool], row_grads: Sequence[bool]) -> Callable:
    """`fn` (an op's implementation: its inputs in call order) with the fault planted. `per_row[i]`: input i
    is per row (its first dimension is the batch); `row_grads[i]`: input i's gradient is a row gradient."""
    first_row_input = list(per_row).index(True)

    def control(*args):
        bits = rounding_bits(args[first_row_input].shape[0])
        args = tuple(_RoundedGradient.apply(a, bits) if wanted and a.requires_grad else a
                     for a, wanted in zip(args, row_grads))
        result = fn(*args)
        if isinstance(result, torch.Tensor):
            return _RoundedForward.apply(result, bits)
        return tuple(_RoundedForward.apply(t, bits) for t in result)

    return control
