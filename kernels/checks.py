"""Argument checks the kernels' public functions share, each raising an error that names the argument.

Every public function checks its arguments before it launches anything, so a bad call fails with the
argument's name instead of inside Triton. The checks below are the ones that read the same in every op
(a tensor, on the first argument's device, on a device Triton runs on, of an allowed dtype, an index in
range); shape checks say what each op's shapes mean and stay with the op. A function calls them in its
own order: when several arguments are wrong, the first check that fails is the error.

These run on every call, so they stay plain loops and comparisons (no tensor work except in
`index_range`, which callers let users switch off).
"""
from __future__ import annotations

import math
import numbers
from typing import Mapping, Optional

import torch

from h3bench.kernels.common import interpreter_active

FLOATS = (torch.bfloat16, torch.float16, torch.float32)
INDEX = (torch.int32, torch.int64)
EXPECTED_FLOAT = "expected one of bfloat16, float16, float32"
EXPECTED_INDEX = "expected int32 or int64"
INF = float("inf")


def tensors(named: Mapping[str, object]) -> None:
    """TypeError naming the first argument that is not a tensor."""
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def same_device(named: Mapping[str, torch.Tensor], anchor: str) -> None:
    """ValueError naming the first argument that is not on `named[anchor]`'s device."""
    device = named[anchor].device
    for name, t in named.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but {anchor} is on {device}")


def triton_device(name: str, t: torch.Tensor, *, what: str = "the Triton kernel needs",
                  any_device_interpreted: bool = False) -> None:
    """ValueError unless `t` is where Triton runs: a CUDA device, or the CPU under the interpreter.

    `what` is the message's subject (the GEMM ops say "the Triton kernels need": they launch several).
    `any_device_interpreted` keeps the GEMM ops' rule, under which the interpreter accepts any device."""
    if t.device.type != "cuda" and not ((any_device_interpreted or t.device.type == "cpu") and interpreter_active()):
        raise ValueError(f"{name} is on {t.device}: {what} a CUDA device "
                         "(or TRITON_INTERPRET=1 set before triton is imported)")


def dtype_in(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...], expected: str) -> None:
    """TypeError unless `t`'s dtype is one of `allowed`; `expected` says which, in the op's words."""
    if t.dtype not in allowed:
        raise TypeError(f"{name} has dtype {t.dtype}; {expected}")


def float_dtype(name: str, t: torch.Tensor) -> None:
    """The kernels' working dtypes: bf16, fp16 or fp32 (fp32 math inside)."""
    dtype_in(name, t, FLOATS, EXPECTED_FLOAT)


def index_dtype(name: str, t: torch.Tensor) -> None:
    """Index tensors: int32 or int64."""
    dtype_in(name, t, INDEX, EXPECTED_INDEX)


def same_dtype(named: Mapping[str, torch.Tensor], names: tuple[str, ...], anchor: str) -> None:
    """TypeError naming the first of `names` whose dtype is not `named[anchor]`'s (tensors that must share
    one dtype, e.g. an activation and the parameters it is combined with)."""
    dtype = named[anchor].dtype
    for name in names:
        if named[name].dtype != dtype:
            raise TypeError(f"{name} has dtype {named[name].dtype} but {anchor} has {dtype}")


def epsilon(eps: object) -> float:
    """eps as a float: TypeError unless a real number (a bool is not one), ValueError unless finite and >= 0.
    A NaN or infinite eps makes every output NaN or zero, a negative one makes rows whose mean square is
    below -eps NaN: silently wrong either way, so refused here. 0 is allowed (as in torch's rms_norm)."""
    if type(eps) is not float:  # the common case skips the ABC check (this runs on every call)
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
            raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    value = float(eps)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    return value


def index_range(name: str, t: torch.Tensor, limit: int, rows_of: Optional[str] = None) -> None:
    """IndexError naming the first entry of `t` (in flat order) outside [0, limit), with its position and
    value; `rows_of` names the tensor the index selects rows of, for the message. One host sync: callers
    offer `check_index=False` to skip it."""
    if t.numel() == 0:
        return
    bad = (t < 0) | (t >= limit)
    if bool(bad.any()):  # one host sync: the price of the check, which can be switched off
        position = int(bad.reshape(-1).nonzero()[0, 0])
        value = int(t.reshape(-1)[position])
        whose = f" ({rows_of} has {limit} rows)" if rows_of else ""
        raise IndexError(f"{name}[{position}] = {value} is outside [0, {limit}){whose}")
