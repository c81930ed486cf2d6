"""The RFC's own CUDA op: `H3RMSNormCudaOp().forward_modulated(x, w, sh, sc, idx, eps=...)`.

rl_engine is not on the package index; the row is unavailable unless `import rl_engine` works
(adapters/_rl_engine.py says how the evidence run builds it).
"""
from __future__ import annotations

from h3bench.adapters._rl_engine import RMSNORM_MODULES, rl_kernel_row
from h3bench.harness.ops.norm_modulate import NormModulateParams


def _call(op, params: NormModulateParams):
    eps = params.eps

    def fn(x, w, sh, sc, idx):
        return op.forward_modulated(x, w, sh, sc, idx, eps=eps)

    return fn


ADAPTER = rl_kernel_row("norm_modulate", "H3RMSNormCudaOp", RMSNORM_MODULES, grads=("x", "w", "sh", "sc"),
                        call=_call, how=".forward_modulated",
                        summary="the RFC's CUDA op H3RMSNormCudaOp.forward_modulated (rl_engine)")
