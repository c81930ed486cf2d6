"""rms_norm, a common op beside the RFC's seven: RMSNorm over the last dimension, with a weight.

    y = x * rsqrt(mean(x^2) + eps) * w        x: [R, H], w: [H] -> y: [R, H]

Shape at the default config: Llama-3-8B's RMSNorm (config.json: hidden_size 4096, rms_norm_eps 1e-5,
torch_dtype bfloat16): bf16 activations and a bf16 weight, as the checkpoint stores it and as HF's
LlamaRMSNorm multiplies it. A row is a token.

Draws: x = 2 randn from the case seed (as norm_modulate's, so the norms see the same spread); the weight is
the same in every case, 0.5 + rand from a generator seeded with PARAM_SEED; everything is drawn on the
target device and rounded to `dtype`. Gradients: x (per row, compared bitwise) and w (a sum over rows,
checked for repeatability).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (NOT_IN_RFC, DtypeParams, Input, Op, OpInputs, Reference, Traffic,
                                      element_size, generator, positive_eps, positive_fields, randn_grad_outs,
                                      torch_dtype)
from h3bench.harness.ops.norm_modulate import rms_norm64  # the float64 norm of norm_modulate's reference

PARAM_SEED = 0  # the weight's generator seed: the same w in every case


@dataclass(frozen=True)
class RmsNormParams(DtypeParams):
    hidden: int
    dtype: str
    eps: float

    def __post_init__(self):
        positive_fields(self, "hidden")
        torch_dtype(self.dtype)
        positive_eps(self.eps)


class RmsNorm(Op):
    name = "rms_norm"
    rfc = NOT_IN_RFC
    inputs = (Input("x", per_row=True, differentiable=True, shape=("R", "hidden")),
              Input("w", differentiable=True, shape=("hidden",)))
    output_shapes = (("R", "hidden"),)
    formula = "y = x * rsqrt(mean(x^2) + eps) * w"
    outputs = ("y",)
    params_type = RmsNormParams
    plan_set = "token"
    constants = ("eps",)
    composition_row = "torch"

    def make_inputs(self, params: RmsNormParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        dtype = params.torch_dtype
        x = (torch.randn(rows, params.hidden, generator=generator(device, seed), device=device) * 2.0).to(dtype)
        w = (0.5 + torch.rand(params.hidden, generator=generator(device, PARAM_SEED), device=device)).to(dtype)
        return self.bundle({"x": x, "w": w})

    def make_grad_outs(self, params: RmsNormParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.hidden, params.torch_dtype, seed, device)

    def reference(self, params: RmsNormParams, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        return self.float64_reference(inputs, grad_outs, grads, variant,
                                      lambda leaves: (rms_norm64(leaves["x"], leaves["w"], params.eps),))

    def floor_traffic(self, params: RmsNormParams, rows: int, backward: bool) -> Traffic:
        """In the working dtype (bf16: 2 B), one [R, H] pass = 2RH bytes and the weight 2H. Forward: read x
        and w, write y (2RH + 2H read, 2RH written). Backward, added: read x again, dy and w, write dx and
        dw (4RH + 2H read, 2RH + 2H written; dw's per-row sum is assumed to stay on chip). So forward+backward
        reads 6RH + 4H and writes 4RH + 2H bytes."""
        size = element_size(params.torch_dtype)
        one_pass, weight = size * rows * params.hidden, size * params.hidden
        if backward:
            return Traffic(read=3 * one_pass + 2 * weight, written=2 * one_pass + weight)
        return Traffic(read=one_pass + weight, written=one_pass)


OP = RmsNorm()
