"""adaln_row_gather, the MiniMax-H3 DiT block's per-row pick of its six AdaLN modulation tensors
(RL-Align/RL-Kernel RFC #420, docs/operators.md, adaln_row_gather).

    outs = table[ti * M + tag].chunk(6, dim=1)     table: [T*M, 6H], ti, tag: [S] -> six [S, H]

`table` is one block's AdaLN projection viewed as `[T*M, 6H]` (diffusers' `MiniMaxH3AdaLayerNormModulation`
returns its six `[T*M, H]` column blocks); table row = timestep * modalities + modality tag. The six outputs
are, in diffusers' order, shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.

Inputs, in the call order of rl-kernel's `H3AdaLNRowGatherCudaOp()(table, ti, tag)`:
- `table` [T*M, chunks*H] (0.1 randn, rounded to `dtype`): differentiable, not per row. Drawn once for every
  case (docs/operators.md, "Common to all": "Parameters and tables are the same for every case"): from a generator seeded with
  `PARAM_SEED` on the target device.
- `ti`, `tag` [S] int64: the RFC's layout for the case seed (`modality_layout`: CPU generator, tags drawn
  first, the first rows get tags 0, 1, 2), moved to the device. Per row, no gradient.

The only gradient is the table's, a parameter gradient (a sum over rows): there is no per-row gradient, so
the batch-invariance verdict rests on the forward counts and the table gradient's repeatability.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (Input, Op, OpInputs, Reference, TableParams, Traffic, adaln_table, element_size,
                              generator, modality_layout, positive_fields, randn_grad_outs, torch_dtype)

# Seed of the generator the table is drawn from: the same table for every case seed (docs/operators.md, adaln_row_gather).
PARAM_SEED = 0
# diffusers' chunk order (MiniMaxH3AdaLayerNormModulation; rl-kernel's H3_ADALN_CHUNK_NAMES)
CHUNK_NAMES = ("shift_msa", "scale_msa", "gate_msa", "shift_mlp", "scale_mlp", "gate_mlp")
INDEX_BYTES = 8  # ti and tag are int64


@dataclass(frozen=True)
class AdaLNRowGatherParams(TableParams):
    hidden: int
    timesteps: int
    modalities: int
    chunks: int
    dtype: str

    def __post_init__(self):
        positive_fields(self, "hidden", "timesteps", "modalities")
        if self.chunks != len(CHUNK_NAMES):
            raise ValueError(f"chunks must be {len(CHUNK_NAMES)} (the op's outputs are the AdaLN table's "
                             f"{len(CHUNK_NAMES)} modulation tensors: {', '.join(CHUNK_NAMES)}), got {self.chunks}")
        torch_dtype(self.dtype)


class AdaLNRowGather(Op):
    name = "adaln_row_gather"
    inputs = (Input("table", differentiable=True, shape=("timesteps*modalities", "chunks*hidden")),
              Input("ti", per_row=True, shape=("R",)), Input("tag", per_row=True, shape=("R",)))
    outputs = CHUNK_NAMES
    output_shapes = tuple(("R", "hidden") for _ in CHUNK_NAMES)
    formula = f"({', '.join(CHUNK_NAMES)}) = table[ti * modalities + tag].chunk(chunks, dim=1)"
    params_type = AdaLNRowGatherParams
    plan_set = "token"
    constants = ("modalities", "chunks")

    def make_inputs(self, params: AdaLNRowGatherParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        table = adaln_table(params.table_rows, params.chunks * params.hidden, generator(device, PARAM_SEED), device,
                            params.torch_dtype)
        ti, tag = modality_layout(rows, seed, params.timesteps, params.modalities)
        return self.bundle({"table": table, "ti": ti.to(device), "tag": tag.to(device)})

    def make_grad_outs(self, params: AdaLNRowGatherParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.hidden, params.torch_dtype, seed, device, count=len(self.outputs))

    def reference(self, params: AdaLNRowGatherParams, inputs: OpInputs,
                  grad_outs: Optional[tuple[torch.Tensor, ...]], grads: tuple[str, ...], variant: str) -> Reference:
        def gather(leaves):
            idx = leaves["ti"] * params.modalities + leaves["tag"]
            return leaves["table"].index_select(0, idx).chunk(params.chunks, dim=1)

        return self.float64_reference(inputs, grad_outs, grads, variant, gather)

    def floor_traffic(self, params: AdaLNRowGatherParams, rows: int, backward: bool) -> Traffic:
        """Indices int64 (8 B), the table and the outputs in the working dtype (bf16: 2 B).
        Forward: per row read ti and tag (2 x 8 bytes) and write the six outputs (6H elements: 64512 bytes
        at H = 5376 in bf16); once per call read the table (T*M x 6H: 580608 bytes, 0.58 MB).
        Backward, added: per row read the indices again and the six upstream gradients (16 + 64512 bytes);
        once write the table gradient (0.58 MB; the table itself is not needed).
        Forward+backward reads (32 + 12H) bytes per row plus the table and writes 12H bytes per row plus
        the table."""
        out_row = params.chunks * params.hidden * element_size(params.torch_dtype)
        table = params.table_rows * out_row
        indices = rows * 2 * INDEX_BYTES
        if backward:
            return Traffic(read=2 * indices + rows * out_row + table, written=rows * out_row + table)
        return Traffic(read=indices + table, written=rows * out_row)


OP = AdaLNRowGather()
