"""The RFC's own CUDA op: `H3FinalAdaLNOutCudaOp()(x, norm_weight, temb, weight, bias, timestep_indices, eps)`
(RFC #420 `final_adaln_out`): a deterministic projection GEMV and the fused norm/modulation kernel, one
autograd node.

Not in the rl-kernel reassembly this project builds (shared/third_party/rl-kernel-h3); the row tries the
RFC script's module and the later layout, so it is recorded unavailable with the ImportError naming both,
and runs unchanged on an rl_engine that has the op.
"""
from __future__ import annotations

import torch

from adapters._rl_engine import rl_engine_attr, rl_engine_source
from harness.adapter import Adapter, Loaded
from harness.ops.final_adaln_out import FinalAdaLNOutParams

FINAL_ADALN_OUT_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.final_adaln_out",
    "rl_engine.backends.cuda.model_specific.minimax_h3.final_adaln_out",
)


def _load(device: torch.device, params: FinalAdaLNOutParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (rl_engine._C extension), got device {device}")
    op_class, module = rl_engine_attr(FINAL_ADALN_OUT_MODULES, "H3FinalAdaLNOutCudaOp")
    op = op_class()  # raises RuntimeError when rl_engine._C lacks the kernels
    eps = params.eps

    def fn(x, nw, temb, W, b, ti):
        return op(x, nw, temb, W, b, ti, eps)

    return Loaded(fn=fn, source=f"rl-kernel H3FinalAdaLNOutCudaOp ({module}, {rl_engine_source()})")


ADAPTER = Adapter(name="rl_kernel", op="final_adaln_out", grads=("x", "nw", "temb", "w", "b"), load=_load,
                  summary="the RFC's CUDA op H3FinalAdaLNOutCudaOp (rl_engine)")
