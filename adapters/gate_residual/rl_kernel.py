"""The RFC's own CUDA op: `H3GateResidualCudaOp()(residual, y, gate, index)` (RFC #420 `adaln_gate_residual`):
residual + gate[index] * y in one pass with the eager expression's two roundings, the gate gathered from
the table view inside the kernel, and a sorted fp32 segment sum for the gate gradient instead of atomics.

Not in the rl-kernel reassembly this project builds (docs/third_party.md); the row tries the
RFC script's module and the later layout, so it is recorded unavailable with the ImportError naming both,
and runs unchanged on an rl_engine that has the op.
"""
from __future__ import annotations

from h3bench.adapters._rl_engine import rl_kernel_row

GATE_RESIDUAL_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.gate_residual",
    "rl_engine.backends.cuda.model_specific.minimax_h3.gate_residual",
)

ADAPTER = rl_kernel_row("gate_residual", "H3GateResidualCudaOp", GATE_RESIDUAL_MODULES, grads=("res", "y", "gate"),
                        summary="the RFC's CUDA op H3GateResidualCudaOp (rl_engine)")
