"""The RFC's own CUDA op: `H3GateResidualCudaOp()(residual, y, gate, index)` (RFC #420 `adaln_gate_residual`):
residual + gate[index] * y in one pass with the eager expression's two roundings, the gate gathered from
the table view inside the kernel, and a sorted fp32 segment sum for the gate gradient instead of atomics.

Not in the rl-kernel reassembly this project builds (shared/third_party/rl-kernel-h3); the row tries the
RFC script's module and the later layout, so it is recorded unavailable with the ImportError naming both,
and runs unchanged on an rl_engine that has the op.
"""
from __future__ import annotations

import torch

from adapters._rl_engine import rl_engine_attr, rl_engine_source
from harness.adapter import Adapter, Loaded
from harness.ops.gate_residual import GateResidualParams

GATE_RESIDUAL_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.gate_residual",
    "rl_engine.backends.cuda.model_specific.minimax_h3.gate_residual",
)


def _load(device: torch.device, params: GateResidualParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (rl_engine._C extension), got device {device}")
    op_class, module = rl_engine_attr(GATE_RESIDUAL_MODULES, "H3GateResidualCudaOp")
    op = op_class()  # raises RuntimeError when rl_engine._C lacks the kernels

    def fn(res, y, gate, idx):
        return op(res, y, gate, idx)

    return Loaded(fn=fn, source=f"rl-kernel H3GateResidualCudaOp ({module}, {rl_engine_source()})")


ADAPTER = Adapter(name="rl_kernel", op="gate_residual", grads=("res", "y", "gate"), load=_load,
                  summary="the RFC's CUDA op H3GateResidualCudaOp (rl_engine)")
