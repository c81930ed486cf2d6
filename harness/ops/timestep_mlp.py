"""timestep_mlp, the MiniMax-H3 timestep MLP (RL-Align/RL-Kernel RFC #420), all fp32.

    out = W2 silu(W1 x + b1) + b2      x: [T, freq_dim], W1: [hidden, freq_dim], b1: [hidden],
                                       W2: [temb_dim, hidden], b2: [temb_dim] -> out: [T, temb_dim]

diffusers' `TimestepEmbedding(256, 5376, out_dim=2688)` (linear_1, SiLU, linear_2). Weights are stored
[out_features, in_features] as nn.Linear stores them. One per-row input (x, the sinusoid features), four
parameters; gradients for all five. The GEMM op: every global mode applies (docs/operators.md, Modes).

Draws (docs/operators.md, "Common to all"): the parameters are the same for every case, drawn once from a
generator seeded with PARAM_SEED, in the order W1, b1, W2, b2: W1 = randn * freq_dim^-0.5,
b1 = 0.02 randn, W2 = randn * hidden^-0.5, b2 = 0.02 randn. x = randn from the case seed. Everything is
drawn on the target device (torch.Generator(device=...)), so a CPU run and a GPU run see different values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (Input, Op, OpInputs, Reference, Traffic, element_size, generator, positive_fields,
                              randn_grad_outs)

DTYPE = torch.float32  # every tensor of the op (docs/operators.md, timestep_mlp)
PARAM_SEED = 0         # the parameters' generator seed: the same W1, b1, W2, b2 in every case
BIAS_SCALE = 0.02


@dataclass(frozen=True)
class TimestepMLPParams:
    freq_dim: int   # x's width, the sinusoid features (256)
    hidden: int     # linear_1's output width, diffusers' time_embed_hidden_dim (5376)
    temb_dim: int   # the output width D, diffusers' time_embed_dim (2688)

    def __post_init__(self):
        positive_fields(self, "freq_dim", "hidden", "temb_dim")

    @property
    def weight_elements(self) -> int:
        """W1, b1, W2, b2 together."""
        return self.hidden * self.freq_dim + self.hidden + self.temb_dim * self.hidden + self.temb_dim


def mlp64(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """The op in whatever dtype it is given (float64 for the reference)."""
    h = x @ w1.T + b1
    return (h * torch.sigmoid(h)) @ w2.T + b2


class TimestepMLP(Op):
    name = "timestep_mlp"
    inputs = (Input("x", per_row=True, differentiable=True, shape=("R", "freq_dim")),
              Input("w1", differentiable=True, shape=("hidden", "freq_dim")),
              Input("b1", differentiable=True, shape=("hidden",)),
              Input("w2", differentiable=True, shape=("temb_dim", "hidden")),
              Input("b2", differentiable=True, shape=("temb_dim",)))
    outputs = ("out",)
    output_shapes = (("R", "temb_dim"),)
    formula = "out = silu(x @ w1.T + b1) @ w2.T + b2"
    params_type = TimestepMLPParams
    plan_set = "timestep"
    mode_tagged_rows = ("diffusers",)  # `diffusers[<mode>]`, as the RFC names the row in every mode

    def parameters(self, params: TimestepMLPParams, device: torch.device) -> dict[str, torch.Tensor]:
        """W1, b1, W2, b2: the same in every case (PARAM_SEED)."""
        gen = generator(device, PARAM_SEED)
        w1 = torch.randn(params.hidden, params.freq_dim, generator=gen, device=device) * params.freq_dim ** -0.5
        b1 = torch.randn(params.hidden, generator=gen, device=device) * BIAS_SCALE
        w2 = torch.randn(params.temb_dim, params.hidden, generator=gen, device=device) * params.hidden ** -0.5
        b2 = torch.randn(params.temb_dim, generator=gen, device=device) * BIAS_SCALE
        return {"w1": w1.to(DTYPE), "b1": b1.to(DTYPE), "w2": w2.to(DTYPE), "b2": b2.to(DTYPE)}

    def make_inputs(self, params: TimestepMLPParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        x = torch.randn(rows, params.freq_dim, generator=generator(device, seed), device=device).to(DTYPE)
        return self.bundle({"x": x, **self.parameters(params, device)})

    def make_grad_outs(self, params: TimestepMLPParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.temb_dim, DTYPE, seed, device)

    def reference(self, params: TimestepMLPParams, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        return self.float64_reference(inputs, grad_outs, grads, variant,
                                      lambda leaves: (mlp64(*(leaves[n] for n in self.input_names)),))

    def floor_traffic(self, params: TimestepMLPParams, rows: int, backward: bool) -> Traffic:
        """fp32 throughout (4 B). With F1 = freq_dim, Hd = hidden, D = temb_dim:

        forward: per row read x (4 F1 = 1024 B at the model's size) and write out (4 D = 10752 B); fixed,
        read W1, b1, W2, b2 once: 4 (Hd F1 + Hd + D Hd + D) = 63,340,032 B (63.3 MB).

        backward, added: per row read dy (4 D) and x again (4 F1, for dW1): 11776 B, and write dx (4 F1):
        1024 B; fixed, read W1, b1 and W2 again (W2 for dh = dy W2, W1 for dx = dh W1, W1 and b1 to
        recompute the hidden pre-activation, whose silu and silu' the backward needs; recomputing costs only
        b1 beyond W1, saving it would cost 8 Hd B per row): 4 (Hd F1 + Hd + D Hd) = 63,329,280 B, and write
        dW1, db1, dW2, db2 once: 63,340,032 B. b2 is not needed by the backward.

        So forward+backward reads 4 (2 F1 + D) = 12800 B per row + 126,669,312 B fixed and writes
        4 (F1 + D) = 11776 B per row + 63,340,032 B fixed.
        """
        size = element_size(DTYPE)
        f1, d = params.freq_dim, params.temb_dim
        read = rows * size * f1 + size * params.weight_elements
        written = rows * size * d
        if backward:
            reread = params.hidden * f1 + params.hidden + d * params.hidden
            read += rows * size * (d + f1) + size * reread
            written += rows * size * f1 + size * params.weight_elements
        return Traffic(read=read, written=written)


OP = TimestepMLP()
