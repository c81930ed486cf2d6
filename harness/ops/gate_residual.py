"""gate_residual, the MiniMax-H3 DiT block's gated residual add (RL-Align/RL-Kernel RFC #420, docs/operators.md, gate_residual).

    out = res + gate[idx] * y      res, y: [S, H], gate: [T*M, H], idx: [S] -> out: [S, H]

In diffusers' `MiniMaxH3TransformerBlock.forward` this is
`hidden_states = residual + gate_msa.index_select(0, adaln_indices) * attn_output` (and the same with
`gate_mlp` and `ff_output`). The inputs are declared in the order of the RFC's own op and of its evidence
script, `H3GateResidualCudaOp()(residual, sublayer_output, gate, adaln_indices)`: (res, y, gate, idx), the
per-row tensors first, then the table, then the index. The diffusers row takes the same arguments and
evaluates the diffusers expression.

Inputs:
- `res`, `y` [S, H] (randn, rounded to `dtype`): per row, differentiable; drawn from the case seed on the
  target device, res first.
- `gate` [T*M, H] (0.1 randn, rounded to `dtype`): differentiable, not per row. As in the model it is a
  column block of the `[T*M, chunks*H]` AdaLN table (`gate_msa`, chunk `GATE_CHUNK`): a strided view, unit
  inner stride and row stride chunks*H, so NOT contiguous (as norm_modulate's sh/sc; rl-kernel's op documents
  its gate as such a "(R, H) row view"; the RFC's script drew a contiguous [T*M, H]). The table is drawn
  once for every case (docs/operators.md, gate_residual) from a generator seeded with `PARAM_SEED` on the target device.
- `idx` [S] int64: timestep * modalities + tag from the RFC's layout for the case seed.

Gradients: res and y (both per row, each compared bitwise) and gate (a parameter gradient, a sum over rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (Input, Op, OpInputs, Reference, TableParams, Traffic, adaln_table, element_size,
                              generator, positive_fields, randn_grad_outs, table_index, torch_dtype)

# Seed of the generator the AdaLN table (and so the gate) is drawn from: the same for every case seed.
PARAM_SEED = 0
# gate_msa is chunk 2 of diffusers' six (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp)
GATE_CHUNK = 2
INDEX_BYTES = 8  # idx is int64


@dataclass(frozen=True)
class GateResidualParams(TableParams):
    hidden: int
    timesteps: int
    modalities: int
    chunks: int
    dtype: str

    def __post_init__(self):
        positive_fields(self, "hidden", "timesteps", "modalities")
        if self.chunks <= GATE_CHUNK:
            raise ValueError(f"chunks must be > {GATE_CHUNK} (the gate is chunk {GATE_CHUNK}, gate_msa, of the "
                             f"AdaLN table), got {self.chunks}")
        torch_dtype(self.dtype)


class GateResidual(Op):
    name = "gate_residual"
    inputs = (Input("res", per_row=True, differentiable=True, shape=("R", "hidden")),
              Input("y", per_row=True, differentiable=True, shape=("R", "hidden")),
              Input("gate", differentiable=True, shape=("timesteps*modalities", "hidden")),
              Input("idx", per_row=True, shape=("R",)))
    outputs = ("out",)
    output_shapes = (("R", "hidden"),)
    formula = "out = res + gate[idx] * y"
    params_type = GateResidualParams
    plan_set = "token"

    def layout(self, params: GateResidualParams, rows: int, seed: int) -> torch.Tensor:
        return table_index(params, rows, seed)

    def make_inputs(self, params: GateResidualParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        h, dtype = params.hidden, params.torch_dtype
        gen = generator(device, seed)
        res = torch.randn(rows, h, generator=gen, device=device).to(dtype)
        y = torch.randn(rows, h, generator=gen, device=device).to(dtype)
        table = adaln_table(params.table_rows, params.chunks * h, generator(device, PARAM_SEED), device, dtype)
        gate = table.chunk(params.chunks, dim=-1)[GATE_CHUNK]  # a strided view, as in the model
        idx = self.layout(params, rows, seed).to(device)
        return self.bundle({"res": res, "y": y, "gate": gate, "idx": idx})

    def make_grad_outs(self, params: GateResidualParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.hidden, params.torch_dtype, seed, device)

    def reference(self, params: GateResidualParams, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        def gated(leaves):
            return (leaves["res"] + leaves["gate"].index_select(0, leaves["idx"]) * leaves["y"],)

        return self.float64_reference(inputs, grad_outs, grads, variant, gated)

    def floor_traffic(self, params: GateResidualParams, rows: int, backward: bool) -> Traffic:
        """res, y, out and the gate in the working dtype (bf16: 2 B), idx int64 (8 B).
        Forward: per row read res and y (2 x 2H bytes: 2 x 10752 at H = 5376 in bf16) and idx (8 bytes) and
        write out (2H); once per call read the gate (T*M x H: 96768 bytes, 97 KB).
        Backward (docs/operators.md, memory floors), added: per row read dout and y (2 x 2H) and idx again (8) and write dres
        and dy (2 x 2H); once read the gate again (for dy) and write its gradient (97 KB each).
        Forward+backward reads (4 x 2H + 16) bytes per row plus 2 x the gate and writes 3 x 2H bytes per
        row plus the gate."""
        row = params.hidden * element_size(params.torch_dtype)
        gate = params.table_rows * row
        if backward:
            return Traffic(read=rows * (4 * row + 2 * INDEX_BYTES) + 2 * gate, written=rows * 3 * row + gate)
        return Traffic(read=rows * (2 * row + INDEX_BYTES) + gate, written=rows * row)


OP = GateResidual()
