"""norm_modulate, the MiniMax-H3 DiT block's norm1/norm2 (RL-Align/RL-Kernel RFC #420).

    n = rms_norm(x, w, eps)              x: [R, H], w: [H]
    y = n * (1 + sc[idx]) + sh[idx]      sh, sc: [M, H] views of a [M, 6H] AdaLN table, idx: [R]

Inputs follow the prior art (docs/operators.md, norm_modulate) so numbers compare: x = 2 randn, w = 0.5 + rand,
tables 0.1 randn, all rounded to the working dtype; idx = timestep * 3 + modality with the first three
rows getting modalities 0, 1, 2. Dense tensors are drawn on the target device with a generator seeded
with the case seed (drawing 131072 x 5376 on the CPU would cost seconds per case); the layout is drawn
on the CPU as the prior art did.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (Input, Op, OpInputs, Reference, TableParams, Traffic, adaln_table, element_size,
                              generator, positive_eps, positive_fields, randn_grad_outs, table_index, torch_dtype)

TABLE_CHUNKS = 6  # the AdaLN table holds six [M, H] chunks; sh and sc are two of them


@dataclass(frozen=True)
class NormModulateParams(TableParams):
    hidden: int
    timesteps: int
    modalities: int
    dtype: str
    eps: float

    def __post_init__(self):
        positive_fields(self, "hidden", "timesteps", "modalities")
        torch_dtype(self.dtype)
        positive_eps(self.eps)


def rms_norm64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w


class NormModulate(Op):
    name = "norm_modulate"
    inputs = (Input("x", per_row=True, differentiable=True, shape=("R", "hidden")),
              Input("w", differentiable=True, shape=("hidden",)),
              Input("sh", differentiable=True, shape=("timesteps*modalities", "hidden")),
              Input("sc", differentiable=True, shape=("timesteps*modalities", "hidden")),
              Input("idx", per_row=True, shape=("R",)))
    outputs = ("y",)
    output_shapes = (("R", "hidden"),)
    formula = "y = rms_norm(x, eps) * w * (1 + sc[idx]) + sh[idx]"
    references = ("rms_norm",)  # rows that implement the norm alone (torch_rms_norm, transformer_engine)
    params_type = NormModulateParams
    plan_set = "token"
    constants = ("eps",)

    def layout(self, params: NormModulateParams, rows: int, seed: int) -> torch.Tensor:
        return table_index(params, rows, seed)

    def make_inputs(self, params: NormModulateParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        h, dtype = params.hidden, params.torch_dtype
        gen = generator(device, seed)
        x = (torch.randn(rows, h, generator=gen, device=device) * 2.0).to(dtype)
        w = (0.5 + torch.rand(h, generator=gen, device=device)).to(dtype)
        table = adaln_table(params.table_rows, TABLE_CHUNKS * h, gen, device, dtype)
        sh, sc = table.chunk(TABLE_CHUNKS, dim=-1)[:2]  # strided views, as in the model
        idx = self.layout(params, rows, seed).to(device)
        return self.bundle({"x": x, "w": w, "sh": sh, "sc": sc, "idx": idx})

    def make_grad_outs(self, params: NormModulateParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.hidden, params.torch_dtype, seed, device)

    def reference(self, params: NormModulateParams, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        def norm_then_modulate(leaves):
            y = rms_norm64(leaves["x"], leaves["w"], params.eps)
            if variant == self.name:  # the rms_norm variant stops at the norm
                idx = leaves["idx"]
                y = y * (1 + leaves["sc"].index_select(0, idx)) + leaves["sh"].index_select(0, idx)
            return (y,)

        return self.float64_reference(inputs, grad_outs, grads, variant, norm_then_modulate)

    def floor_traffic(self, params: NormModulateParams, rows: int, backward: bool) -> Traffic:
        """In the working dtype (bf16: 2 B), one [R, H] pass = 2RH bytes. Forward: read x, write y (2RH read,
        2RH written). Backward, added: read x again and dy, write dx (4RH read, 2RH written). So
        forward+backward reads 6RH and writes 4RH bytes. The tables, w, idx and the table and w gradients
        are O(M*H) or O(R) and left out."""
        one_pass = element_size(params.torch_dtype) * rows * params.hidden
        if backward:
            return Traffic(read=3 * one_pass, written=2 * one_pass)
        return Traffic(read=one_pass, written=one_pass)


OP = NormModulate()
