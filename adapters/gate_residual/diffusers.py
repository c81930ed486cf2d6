"""The gated residual diffusers' MiniMax-H3 block runs, replayed (diffusers 0.42.1):
`hidden_states = residual + gate_msa.index_select(0, adaln_indices) * attn_output`
(`MiniMaxH3TransformerBlock.forward`; the same with gate_mlp and ff_output). Two roundings: the product, then
the sum. The gate gradient is index_select's backward: an index_add (atomic scatter-add on CUDA)."""
from __future__ import annotations

import torch

from h3bench.adapters._diffusers import diffusers_installed
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.gate_residual import GateResidualParams


def _load(device: torch.device, params: GateResidualParams) -> Loaded:
    def composition(res, y, gate, idx):
        return res + gate.index_select(0, idx) * y

    return Loaded(fn=composition,
                  source=("diffusers MiniMax-H3 composition replayed (res + gate.index_select(0, idx) * y)"
                          f"{diffusers_installed()}"))


ADAPTER = Adapter(name="diffusers", op="gate_residual", grads=("res", "y", "gate"), load=_load,
                  summary="res + gate.index_select(0, idx) * y, as diffusers' MiniMaxH3TransformerBlock")
