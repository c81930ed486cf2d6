"""The gated residual diffusers' MiniMax-H3 block runs, replayed (diffusers 0.42.1):
`hidden_states = residual + gate_msa.index_select(0, adaln_indices) * attn_output`
(`MiniMaxH3TransformerBlock.forward`; the same with gate_mlp and ff_output). Two roundings: the product, then
the sum. The gate gradient is index_select's backward: an index_add (atomic scatter-add on CUDA)."""
from __future__ import annotations

from importlib import metadata

import torch

from harness.adapter import Adapter, Loaded
from harness.ops.gate_residual import GateResidualParams


def _load(device: torch.device, params: GateResidualParams) -> Loaded:
    def composition(res, y, gate, idx):
        return res + gate.index_select(0, idx) * y

    try:
        version = f" (diffusers {metadata.version('diffusers')} installed)"
    except metadata.PackageNotFoundError:
        version = ""
    return Loaded(fn=composition,
                  source=f"diffusers MiniMax-H3 composition replayed (res + gate.index_select(0, idx) * y){version}")


ADAPTER = Adapter(name="diffusers", op="gate_residual", grads=("res", "y", "gate"), load=_load,
                  summary="res + gate.index_select(0, idx) * y, as diffusers' MiniMaxH3TransformerBlock")
