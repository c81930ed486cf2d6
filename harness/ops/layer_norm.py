"""layer_norm, a common op beside the RFC's seven: LayerNorm over the last dimension, weight and bias.

    y = (x - mean(x)) * rsqrt(var(x) + eps) * w + b      x: [R, H], w, b: [H] -> y: [R, H]
                                                          (var: the biased variance, as F.layer_norm's)

Shape at the default config: Wan2.1-14B's cross-attention norm, a DiT's affine LayerNorm (diffusers
WanTransformer3DModel defaults: 40 heads x 128 = 5120 wide, eps 1e-6, cross_attn_norm=True makes each
block's `norm2` an FP32LayerNorm(5120, eps, elementwise_affine=True); `_keep_in_fp32_modules` holds
norm2, so its weight and bias are fp32 while the activations are bf16; FP32LayerNorm computes in fp32 and
returns the input's dtype). So: x and y in `dtype` (bf16), w and b in `param_dtype` (fp32), the output
in x's dtype. A row is a token.

Draws: x = 2 randn from the case seed; w = 0.5 + rand and b = 0.1 randn, the same in every case (one
generator seeded with PARAM_SEED, w first); on the target device, rounded to their dtypes. Gradients: x
(per row, compared bitwise), w and b (sums over rows, checked for repeatability).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (DTYPES, NOT_IN_RFC, DtypeParams, Input, Op, OpInputs, Reference, Traffic,
                                      element_size, generator, positive_eps, positive_fields, randn_grad_outs,
                                      torch_dtype)

PARAM_SEED = 0
BIAS_SCALE = 0.1


@dataclass(frozen=True)
class LayerNormParams(DtypeParams):
    hidden: int
    dtype: str        # x and y
    param_dtype: str  # w and b
    eps: float

    def __post_init__(self):
        positive_fields(self, "hidden")
        torch_dtype(self.dtype)
        if self.param_dtype not in DTYPES:
            raise ValueError(f"param_dtype must be one of {sorted(DTYPES)}, got {self.param_dtype!r}")
        positive_eps(self.eps)

    @property
    def torch_param_dtype(self) -> torch.dtype:
        return torch_dtype(self.param_dtype)


def layer_norm64(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    centered = x - x.mean(dim=-1, keepdim=True)
    return centered * torch.rsqrt(centered.pow(2).mean(dim=-1, keepdim=True) + eps) * w + b


class LayerNorm(Op):
    name = "layer_norm"
    rfc = NOT_IN_RFC
    inputs = (Input("x", per_row=True, differentiable=True, shape=("R", "hidden")),
              Input("w", differentiable=True, shape=("hidden",)), Input("b", differentiable=True, shape=("hidden",)))
    output_shapes = (("R", "hidden"),)
    formula = "y = (x - mean(x)) * rsqrt(var(x) + eps) * w + b"
    outputs = ("y",)
    params_type = LayerNormParams
    plan_set = "token"
    constants = ("eps",)
    composition_row = "torch"

    def make_inputs(self, params: LayerNormParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        x = (torch.randn(rows, params.hidden, generator=generator(device, seed), device=device) * 2.0
             ).to(params.torch_dtype)
        gen = generator(device, PARAM_SEED)
        w = (0.5 + torch.rand(params.hidden, generator=gen, device=device)).to(params.torch_param_dtype)
        b = (BIAS_SCALE * torch.randn(params.hidden, generator=gen, device=device)).to(params.torch_param_dtype)
        return self.bundle({"x": x, "w": w, "b": b})

    def make_grad_outs(self, params: LayerNormParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.hidden, params.torch_dtype, seed, device)

    def reference(self, params: LayerNormParams, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        return self.float64_reference(inputs, grad_outs, grads, variant, lambda leaves: (
            layer_norm64(leaves["x"], leaves["w"], leaves["b"], params.eps),))

    def floor_traffic(self, params: LayerNormParams, rows: int, backward: bool) -> Traffic:
        """With A = the activations' element size (bf16: 2 B) and P = the parameters' (fp32: 4 B), one
        [R, H] pass is ARH bytes and w or b PH. Forward: read x, w, b, write y (ARH + 2PH read, ARH
        written). Backward, added: read x again, dy and w, write dx, dw and db (2ARH + PH read, ARH + 2PH
        written; the per-row sums of dw and db assumed to stay on chip). So forward+backward reads
        3ARH + 3PH and writes 2ARH + 2PH bytes."""
        one_pass = element_size(params.torch_dtype) * rows * params.hidden
        param = element_size(params.torch_param_dtype) * params.hidden
        if backward:
            return Traffic(read=3 * one_pass + 3 * param, written=2 * one_pass + 2 * param)
        return Traffic(read=one_pass + 2 * param, written=one_pass)


OP = LayerNorm()
