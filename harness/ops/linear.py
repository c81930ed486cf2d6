"""linear, a common op beside the RFC's seven: a projection without bias, y = x W^T.

    y = x @ w.T        x: [R, in_features], w: [out_features, in_features] -> y: [R, out_features]

Shape at the default config: Llama-3-8B's attention output projection `o_proj` (config.json: hidden_size
4096, 32 heads x 128 = 4096 in, nn.Linear(4096, 4096, bias=False), torch_dtype bfloat16): bf16 activations
and a bf16 weight stored [out, in] as nn.Linear stores it. A row is a token. The GEMM op among the common
ops, so the global modes apply to it as to timestep_mlp (`mode_tagged_rows`): F.linear reaches aten mm,
which sglang and megatron replace; vLLM on Hopper keeps cuBLASLt and sets its workspace variables
(harness/modes/library_modes.py lists what each mode replaces).

Draws: x = randn from the case seed; w = randn * in_features^-0.5 (unit-variance outputs), the same in
every case (PARAM_SEED); on the target device, rounded to `dtype`. Gradients: x (per row, compared
bitwise) and w (dW = dy^T x, a sum over rows, checked for repeatability).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (NOT_IN_RFC, DtypeParams, Input, Op, OpInputs, Reference, Traffic,
                                      element_size, generator, positive_fields, randn_grad_outs, torch_dtype)

PARAM_SEED = 0


@dataclass(frozen=True)
class LinearParams(DtypeParams):
    in_features: int
    out_features: int
    dtype: str

    def __post_init__(self):
        positive_fields(self, "in_features", "out_features")
        torch_dtype(self.dtype)


class Linear(Op):
    name = "linear"
    rfc = NOT_IN_RFC
    inputs = (Input("x", per_row=True, differentiable=True, shape=("R", "in_features")),
              Input("w", differentiable=True, shape=("out_features", "in_features")))
    output_shapes = (("R", "out_features"),)
    formula = "y = x @ w.T"
    outputs = ("y",)
    params_type = LinearParams
    plan_set = "token"
    composition_row = "torch"
    mode_tagged_rows = ("torch",)  # `torch[<mode>]`: the same F.linear under every global mode

    def make_inputs(self, params: LinearParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        dtype = params.torch_dtype
        x = torch.randn(rows, params.in_features, generator=generator(device, seed), device=device).to(dtype)
        w = (torch.randn(params.out_features, params.in_features, generator=generator(device, PARAM_SEED),
                         device=device) * params.in_features ** -0.5).to(dtype)
        return self.bundle({"x": x, "w": w})

    def make_grad_outs(self, params: LinearParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.out_features, params.torch_dtype, seed, device)

    def reference(self, params: LinearParams, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        return self.float64_reference(inputs, grad_outs, grads, variant,
                                      lambda leaves: (leaves["x"] @ leaves["w"].T,))

    def floor_traffic(self, params: LinearParams, rows: int, backward: bool) -> Traffic:
        """In the working dtype (bf16: 2 B), with K = in_features, N = out_features: forward reads x (2RK)
        and w (2NK) and writes y (2RN). Backward, added: reads dy (2RN), w again (for dx = dy w) and x again
        (for dW = dy^T x), and writes dx (2RK) and dW (2NK). So forward+backward reads 2(2RK + RN + 2NK) and
        writes 2(RK + RN + NK) bytes. A floor of memory traffic only: at these sizes the GEMM is bound by
        its FLOPs, which this model does not price."""
        size = element_size(params.torch_dtype)
        k, n = params.in_features, params.out_features
        read, written = size * (rows * k + n * k), size * rows * n
        if backward:
            read += size * (rows * n + n * k + rows * k)
            written += size * (rows * k + n * k)
        return Traffic(read=read, written=written)


OP = Linear()
