"""The RFC's own CUDA op: `H3FinalAdaLNOutCudaOp()(x, norm_weight, temb, weight, bias, timestep_indices, eps)`
(RFC #420 `final_adaln_out`): a deterministic projection GEMV and the fused norm/modulation kernel, one
autograd node.

Not in the rl-kernel reassembly this project builds (docs/third_party.md); the row tries the
RFC script's module and the later layout, so it is recorded unavailable with the ImportError naming both,
and runs unchanged on an rl_engine that has the op.
"""
from __future__ import annotations

from h3bench.adapters._rl_engine import rl_kernel_row
from h3bench.harness.ops.final_adaln_out import FinalAdaLNOutParams

FINAL_ADALN_OUT_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.final_adaln_out",
    "rl_engine.backends.cuda.model_specific.minimax_h3.final_adaln_out",
)


def _call(op, params: FinalAdaLNOutParams):
    eps = params.eps

    def fn(x, nw, temb, W, b, ti):
        return op(x, nw, temb, W, b, ti, eps)

    return fn


ADAPTER = rl_kernel_row("final_adaln_out", "H3FinalAdaLNOutCudaOp", FINAL_ADALN_OUT_MODULES,
                        grads=("x", "nw", "temb", "w", "b"), call=_call,
                        summary="the RFC's CUDA op H3FinalAdaLNOutCudaOp (rl_engine)")
