"""The RFC's own CUDA op: `H3RMSNormCudaOp().forward_modulated(x, w, sh, sc, idx, eps=...)`.

rl_engine is not on the package index; the row is unavailable unless `import rl_engine` works.
The op has lived in two places (the RFC script's commit, then a later layout); both are tried.
"""
from __future__ import annotations

import importlib
import sys
from importlib import metadata

import torch

from harness.adapter import Adapter, Loaded

RMSNORM_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.rmsnorm",
    "rl_engine.backends.cuda.model_specific.minimax_h3.rmsnorm",
)
ROW_GATHER_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.adaln_row_gather",
    "rl_engine.backends.cuda.model_specific.minimax_h3.adaln_row_gather",
)


def rl_engine_attr(modules: tuple[str, ...], attr: str):
    """(object, module name) for the first of `modules` that has `attr`; ImportError otherwise."""
    importlib.import_module("rl_engine")  # its own ImportError is the clearest reason
    tried = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            tried.append(f"{name} ({exc})")
            continue
        if hasattr(module, attr):
            return getattr(module, attr), name
        tried.append(f"{name} (no {attr})")
    raise ImportError(f"rl_engine has no {attr}: tried " + "; ".join(tried))


def rl_engine_version() -> str:
    for dist in metadata.packages_distributions().get("rl_engine", []):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return f"rl_engine {getattr(sys.modules['rl_engine'], '__version__', '(version unknown)')}"


def _load(device: torch.device) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (rl_engine._C extension), got device {device}")
    op_class, module = rl_engine_attr(RMSNORM_MODULES, "H3RMSNormCudaOp")
    op = op_class()  # raises RuntimeError when rl_engine._C lacks the kernels

    def fn(x, w, sh, sc, idx, eps: float = 1e-5):
        return op.forward_modulated(x, w, sh, sc, idx, eps=eps)

    return Loaded(fn=fn, source=(f"rl-kernel H3RMSNormCudaOp.forward_modulated ({module}, "
                                 f"{rl_engine_version()})"))


ADAPTER = Adapter(name="rl_kernel", op="norm_modulate", grads=("x", "w", "sh", "sc"), load=_load,
                  summary="the RFC's CUDA op H3RMSNormCudaOp.forward_modulated (rl_engine)")
