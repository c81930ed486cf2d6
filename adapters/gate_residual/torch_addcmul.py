"""`torch.addcmul(res, gate.index_select(0, idx), y)`: the fused pointwise op a user would pick instead.

addcmul computes res + g * y per element in fp32 for bf16 inputs and rounds once (observed on the CPU;
CUDA's kernel also works in the fp32 "opmath" type), where the diffusers expression rounds the product
first, so its forward bits differ from the diffusers row's; its gradients are the same pointwise products
and the same index_select backward (index_add) for the gate.
"""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.gate_residual import GateResidualParams


def _load(device: torch.device, params: GateResidualParams) -> Loaded:
    def addcmul(res, y, gate, idx):
        return torch.addcmul(res, gate.index_select(0, idx), y)

    return Loaded(fn=addcmul, source=f"torch {torch.__version__} torch.addcmul(res, gate.index_select(0, idx), y)")


ADAPTER = Adapter(name="torch_addcmul", op="gate_residual", grads=("res", "y", "gate"), load=_load,
                  summary="torch.addcmul on index_select'ed gate rows")
