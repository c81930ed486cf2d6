"""An RMSNorm declared as a user op: everything `h3bench run --op docs/examples/rms_norm_op.py:RMS_NORM`
needs (README.md, "Your own op").

    y = x / sqrt(mean(x^2, last dim) + eps) * weight        x: [rows, hidden], weight: [hidden]

x is per row and gets a gradient; weight is shared by every row and gets one (a parameter gradient: the
probes check that it repeats bitwise). The constants' defaults are the run's config (`--set hidden=4096`).
docs/examples/rms_norm_impl.py holds a plain-torch implementation to run as a row (`--adapter`).
"""
from __future__ import annotations

import torch

from h3bench.harness.ops import Input, Traffic, UserOp


def make_inputs(params, rows: int, seed: int, device: torch.device) -> dict:
    """x drawn from `seed`; weight from a fixed seed, so every case has the same weight."""
    dtype = getattr(torch, params.dtype)
    x = torch.randn(rows, params.hidden, generator=torch.Generator(device=device).manual_seed(seed), device=device)
    weight = 1 + 0.1 * torch.randn(params.hidden, generator=torch.Generator(device=device).manual_seed(0),
                                   device=device)
    return {"x": x.to(dtype), "weight": weight.to(dtype)}


def reference(x: torch.Tensor, weight: torch.Tensor, *, eps: float) -> torch.Tensor:
    """The math, in whatever dtype it is given: the harness evaluates it in float64 for the accuracy figures
    (and, as the negative control's honest composition, in the inputs' own dtype)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def floor_traffic(params, rows: int, backward: bool) -> Traffic:
    """The fewest bytes read and written: the forward reads x and weight and writes y; the backward also
    reads x, weight and dy again and writes dx and dweight."""
    size = torch.empty((), dtype=getattr(torch, params.dtype)).element_size()
    row_bytes, weight_bytes = rows * params.hidden * size, params.hidden * size
    if backward:
        return Traffic(read=3 * row_bytes + 2 * weight_bytes, written=2 * row_bytes + weight_bytes)
    return Traffic(read=row_bytes + weight_bytes, written=row_bytes)


RMS_NORM = UserOp(
    name="example_rms_norm",
    inputs=(Input("x", per_row=True, differentiable=True), Input("weight", differentiable=True)),
    outputs=("y",),
    constants={"hidden": 64, "eps": 1e-6, "dtype": "bfloat16"},
    make_inputs=make_inputs,
    reference=reference,
    floor_traffic=floor_traffic,  # optional: without it the run has no memory floors
)
