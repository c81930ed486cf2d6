"""The RFC's own CUDA op: `H3RMSNormCudaOp().forward_modulated(x, w, sh, sc, idx, eps=...)`.

rl_engine is not on the package index; the row is unavailable unless `import rl_engine` works
(adapters/_rl_engine.py says how the evidence run builds it).
"""
from __future__ import annotations

import torch

from adapters._rl_engine import RMSNORM_MODULES, rl_engine_attr, rl_engine_source
from harness.adapter import Adapter, Loaded
from harness.ops.norm_modulate import NormModulateParams


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (rl_engine._C extension), got device {device}")
    op_class, module = rl_engine_attr(RMSNORM_MODULES, "H3RMSNormCudaOp")
    op = op_class()  # raises RuntimeError when rl_engine._C lacks the kernels
    eps = params.eps

    def fn(x, w, sh, sc, idx):
        return op.forward_modulated(x, w, sh, sc, idx, eps=eps)

    return Loaded(fn=fn, source=f"rl-kernel H3RMSNormCudaOp.forward_modulated ({module}, {rl_engine_source()})")


ADAPTER = Adapter(name="rl_kernel", op="norm_modulate", grads=("x", "w", "sh", "sc"), load=_load,
                  summary="the RFC's CUDA op H3RMSNormCudaOp.forward_modulated (rl_engine)")
