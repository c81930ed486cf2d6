"""softmax, a common op beside the RFC's seven: softmax over the last dimension.

    y = exp(x - max(x)) / sum(exp(x - max(x)))        x: [R, S] -> y: [R, S]

Shape at the default config: attention-score rows of an eager attention over a 4096-token context (Llama-3
8B's eager path, HF `eager_attention_forward`: `softmax(scores, dim=-1, dtype=torch.float32)`): S = 4096
keys, fp32. fp32 because that is the dtype the models' eager attention takes its softmax in, whatever the
activations' dtype; a row is one query's scores (a [batch, heads, queries, keys] tensor flattened to rows).

Draws: x = 2 randn from the case seed on the target device, rounded to `dtype` (scores with a standard
deviation of 2: peaked rows; unit-variance scores over 4096 keys give nearly uniform probabilities).
Gradients: x only (per row, compared bitwise); the op has no parameters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (NOT_IN_RFC, DtypeParams, Input, Op, OpInputs, Reference, Traffic,
                                      element_size, generator, positive_fields, randn_grad_outs, torch_dtype)

SCORE_SCALE = 2.0


@dataclass(frozen=True)
class SoftmaxParams(DtypeParams):
    width: int  # S, the softmax dimension (keys per score row)
    dtype: str

    def __post_init__(self):
        positive_fields(self, "width")
        torch_dtype(self.dtype)


class Softmax(Op):
    name = "softmax"
    rfc = NOT_IN_RFC
    inputs = (Input("x", per_row=True, differentiable=True, shape=("R", "width")),)
    output_shapes = (("R", "width"),)
    formula = "y = softmax(x, dim=-1)"
    outputs = ("y",)
    params_type = SoftmaxParams
    plan_set = "token"
    composition_row = "torch"

    def make_inputs(self, params: SoftmaxParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        x = torch.randn(rows, params.width, generator=generator(device, seed), device=device) * SCORE_SCALE
        return self.bundle({"x": x.to(params.torch_dtype)})

    def make_grad_outs(self, params: SoftmaxParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.width, params.torch_dtype, seed, device)

    def reference(self, params: SoftmaxParams, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        def softmax64(leaves):
            x = leaves["x"]
            e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
            return (e / e.sum(dim=-1, keepdim=True),)

        return self.float64_reference(inputs, grad_outs, grads, variant, softmax64)

    def floor_traffic(self, params: SoftmaxParams, rows: int, backward: bool) -> Traffic:
        """In the working dtype (fp32: 4 B), one [R, S] pass = 4RS bytes. Forward: read x, write y. Backward,
        added: dx = y * (dy - sum(dy * y)) reads y and dy and writes dx. So forward+backward reads 3 and
        writes 2 passes."""
        one_pass = element_size(params.torch_dtype) * rows * params.width
        if backward:
            return Traffic(read=3 * one_pass, written=2 * one_pass)
        return Traffic(read=one_pass, written=one_pass)


OP = Softmax()
