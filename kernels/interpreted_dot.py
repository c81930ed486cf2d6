"""`tl.dot` under the Triton interpreter in a fixed order, independent of the CPU's BLAS.

The interpreter computes `tl.dot(a, b, acc)` as `numpy.matmul(a, b) + acc`, i.e. with whatever BLAS kernel
numpy picked for this CPU. OpenBLAS's kernels (Haswell, Zen, SkylakeX: FMA, with their own edge paths for
the last rows of a block) give a row of the product different bits depending on where it sits in the block,
so under the interpreter a kernel's row-alone-versus-in-a-batch bits were a property of the CPU, not of the
kernel's tiles: `OPENBLAS_CORETYPE=Zen python -m pytest tests/test_kernel_gemm.py` failed 24 bitwise
checks that passed with `OPENBLAS_CORETYPE=Prescott`.

Here `tl.dot(a, b, acc)` is a chain of fused multiply-adds, as the GPU's FMA chains and MMA accumulation
are: for k = 0, 1, ... in turn, acc = round(acc + a[m, k] b[k, n]), in the accumulator's dtype. Each product
is exact (formed in float64: fp8, fp16, bf16 and fp32 operands have at most 24 significant bits) and is
added in float64 before the one rounding to the accumulator's dtype (for a float32 accumulator a double
rounding, deterministic like the rest). Elementwise numpy arithmetic is IEEE-exact whatever the CPU's
SIMD width, so a dot's result depends on its operands only: a row's bits are the same in any position of
the block and on any CPU, and two dots chained through acc give the bits of one dot over the joined K.
Integer dots keep numpy's matmul (exact).

Installed by `kernels.common` when the interpreter is on (it only ever runs on the CPU); the compiled GPU
path never sees it.
"""
from __future__ import annotations

import numpy as np


def fixed_order_dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """acc + a @ b over the last two axes (leading axes broadcast) as a chain: for k = 0, 1, ... in turn,
    acc = round(acc + a[:, k] b[k, :]), in acc's dtype. Integer operands: numpy's matmul (exact)."""
    if not (np.issubdtype(a.dtype, np.floating) and np.issubdtype(b.dtype, np.floating)):
        return np.matmul(a, b, dtype=acc.dtype) + acc
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    shape = np.broadcast_shapes(a64.shape[:-2], b64.shape[:-2]) + (a64.shape[-2], b64.shape[-1])
    out = np.array(np.broadcast_to(acc, shape), dtype=acc.dtype)
    for i in range(a64.shape[-1]):
        out = (out + a64[..., :, i:i + 1] * b64[..., i:i + 1, :]).astype(acc.dtype)
    return out


def _bf16_as_float(data: np.ndarray, dtype) -> np.ndarray:
    """The interpreter's bf16 (uint16 bits) as float32 values, exactly; other dtypes as they are."""
    if not dtype.is_bf16():
        return data
    return (data.astype(np.uint32) << 16).view(np.float32)


_INSTALLED: dict = {}


def install() -> None:
    """Replace the interpreter's `create_dot` with the fixed-order product (once per process)."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if "create_dot" in _INSTALLED:
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a_data, b_data = a.data, b.data
        if (a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating()) or \
           (b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()):
            # as the interpreter itself: fp8 operands are widened to fp16 first
            a_data = interpreter._convert_float(a_data, a.dtype, interpreter.tl.float16, None).view(np.float16)
            b_data = interpreter._convert_float(b_data, b.dtype, interpreter.tl.float16, None).view(np.float16)
        # bf16 is held as its uint16 bits there (numpy has no bf16); numpy's matmul multiplied the integers
        a_data, b_data = _bf16_as_float(a_data, a.dtype), _bf16_as_float(b_data, b.dtype)
        return interpreter.TensorHandle(fixed_order_dot(a_data, b_data, d.data), d.dtype.scalar)

    create_dot.__doc__ = "tl.dot in a fixed order (kernels/interpreted_dot.py), not numpy's BLAS matmul."
    builder.create_dot = create_dot
    _INSTALLED["create_dot"] = original
