"""final_adaln_out, the MiniMax-H3 DiT's output norm `norm_out` (RL-Align/RL-Kernel RFC #420, docs/operators.md, final_adaln_out).

    [shift | scale] = (W bf16(silu(temb)) + b).chunk(2)         temb: [T, D], W: [2H, D], b: [2H]
    out = rms_norm(x, nw, eps) * (1 + scale[ti]) + shift[ti]    x: [S, H], nw: [H], ti: [S] -> out: [S, H]

diffusers' `MiniMaxH3AdaLayerNormOut.forward(hidden_states, temb, timestep_indices)` (0.42.1):

    shift, scale = self.linear(nn.functional.silu(temb).to(get_parameter_dtype(self.linear))).chunk(2, dim=-1)
    hidden_states = self.norm(hidden_states)
    return hidden_states * (1.0 + scale.index_select(0, timestep_indices)) + shift.index_select(0, timestep_indices)

with `norm = nn.RMSNorm(H, eps)` (weight `nw`) and `linear = nn.Linear(D, 2H)` (`W`, `b`): shift is the first
half of the projection, scale the second. The table has one row per timestep (not per timestep and modality).

Inputs, in call order (x, nw, temb, w, b, ti), named as the RFC's evidence names their gradients:
- `x` [S, H] (2 randn, rounded to `dtype`): per row, differentiable; drawn from the case seed on the device.
- `nw` [H] (0.5 + rand), `temb` [T, D] (randn, `temb_dtype` = float32: the time embedder's output),
  `W` [2H, D] (randn * D^-0.5), `b` [2H] (0.02 randn), W, b, nw rounded to `dtype`: differentiable, not per
  row, drawn once for every case (docs/operators.md, final_adaln_out) from a generator seeded with `PARAM_SEED` on the device, in
  that order. temb is an activation in the model but is not per row (one row per timestep, shared by every
  row of the batch), so it is drawn with the parameters.
- `ti` [S] int64: the timestep of the RFC's layout for the case seed (modality_layout draws the tags first,
  so the timesteps match those of the other token ops' layout).

The reference is the declared math in float64 with no intermediate rounding (no bf16 cast of silu(temb) nor
of the projection); the diffusers row rounds both, which is part of its error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from h3bench.harness.ops.base import (DtypeParams, Input, Op, OpInputs, Reference, Traffic, element_size, generator,
                              modality_layout,
                              positive_eps, positive_fields, randn_grad_outs, torch_dtype)
from h3bench.harness.ops.norm_modulate import rms_norm64

# Seed of the generator nw, temb, W and b are drawn from: the same for every case seed.
PARAM_SEED = 0
INDEX_BYTES = 8  # ti is int64


@dataclass(frozen=True)
class FinalAdaLNOutParams(DtypeParams):
    hidden: int
    temb_dim: int
    timesteps: int
    modalities: int  # not an index of this op's table, but the layout draws tags before timesteps
    dtype: str
    temb_dtype: str
    eps: float

    def __post_init__(self):
        positive_fields(self, "hidden", "temb_dim", "timesteps", "modalities")
        torch_dtype(self.dtype)
        torch_dtype(self.temb_dtype)
        positive_eps(self.eps)

    @property
    def temb_torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.temb_dtype)


class FinalAdaLNOut(Op):
    name = "final_adaln_out"
    inputs = (Input("x", per_row=True, differentiable=True, shape=("R", "hidden")),
              Input("nw", differentiable=True, shape=("hidden",)),
              Input("temb", differentiable=True, shape=("timesteps", "temb_dim")),
              Input("w", differentiable=True, shape=("2*hidden", "temb_dim")),
              Input("b", differentiable=True, shape=("2*hidden",)),
              Input("ti", per_row=True, shape=("R",)))
    outputs = ("out",)
    output_shapes = (("R", "hidden"),)
    formula = ("shift, scale = (silu(temb) @ w.T + b).chunk(2, dim=-1); "
               "out = rms_norm(x, eps) * nw * (1 + scale[ti]) + shift[ti]")
    params_type = FinalAdaLNOutParams
    plan_set = "token"
    constants = ("eps",)

    def make_inputs(self, params: FinalAdaLNOutParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        h, d, dtype = params.hidden, params.temb_dim, params.torch_dtype
        gen = generator(device, seed)
        x = (torch.randn(rows, h, generator=gen, device=device) * 2.0).to(dtype)
        pgen = generator(device, PARAM_SEED)
        nw = (0.5 + torch.rand(h, generator=pgen, device=device)).to(dtype)
        temb = torch.randn(params.timesteps, d, generator=pgen, device=device).to(params.temb_torch_dtype)
        w = (torch.randn(2 * h, d, generator=pgen, device=device) * d ** -0.5).to(dtype)
        b = (torch.randn(2 * h, generator=pgen, device=device) * 0.02).to(dtype)
        ti, _tags = modality_layout(rows, seed, params.timesteps, params.modalities)
        return self.bundle({"x": x, "nw": nw, "temb": temb, "w": w, "b": b, "ti": ti.to(device)})

    def make_grad_outs(self, params: FinalAdaLNOutParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.hidden, params.torch_dtype, seed, device)

    def reference(self, params: FinalAdaLNOutParams, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        def norm_out(leaves):
            shift, scale = F.linear(F.silu(leaves["temb"]), leaves["w"], leaves["b"]).chunk(2, dim=-1)
            ti = leaves["ti"]
            n = rms_norm64(leaves["x"], leaves["nw"], params.eps)
            return (n * (1 + scale.index_select(0, ti)) + shift.index_select(0, ti),)

        return self.float64_reference(inputs, grad_outs, grads, variant, norm_out)

    def floor_traffic(self, params: FinalAdaLNOutParams, rows: int, backward: bool) -> Traffic:
        """x, out, W in the working dtype (bf16: 2 B), ti int64 (8 B).
        Forward: per row read x (2H bytes: 10752 at H = 5376 in bf16) and ti (8 bytes) and write out (2H);
        once per call read W (2H x D: 57802752 bytes, 57.8 MB, the small fixed GEMV).
        Backward, added: per row read dout and x (2 x 2H) and ti again (8) and write dx (2H); once read W
        again (dtemb = silu'(temb) * (dproj @ W)) and write dW (57.8 MB each).
        Forward+backward reads (3 x 2H + 16) bytes per row plus 2 x W and writes 2 x 2H bytes per row plus
        W. As in docs/operators.md's memory floors, only W is counted of the fixed tensors: b, nw and temb (21504 + 10752
        + 32256 bytes at the model's size) are 0.1% of it."""
        row = params.hidden * element_size(params.torch_dtype)
        weight = 2 * params.hidden * params.temb_dim * element_size(params.torch_dtype)
        if backward:
            return Traffic(read=rows * (3 * row + 2 * INDEX_BYTES) + 2 * weight, written=rows * 2 * row + weight)
        return Traffic(read=rows * (row + INDEX_BYTES) + weight, written=rows * row)


OP = FinalAdaLNOut()
