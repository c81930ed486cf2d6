"""Liger's fused modulated RMSNorm on rows pre-gathered with index_select.

`LigerModulatedRMSNormFunction.apply(X, W, scale, shift, eps, offset, casting_mode, in_place)`
computes `(1 + scale) * RMSNorm(X) * W + shift` with per-token scale/shift rows. The table
gradients come from index_select's backward (an atomic scatter-add), as in the RFC's script.
"""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded, installed_version
from h3bench.harness.ops.norm_modulate import NormModulateParams

MODULE = "liger_kernel.ops.modulated_rms_norm"


def liger_version() -> str:
    return installed_version("liger-kernel")


def load_liger_function():
    """The autograd Function, imported from its own module (the RFC script's import)."""
    from liger_kernel.ops.modulated_rms_norm import LigerModulatedRMSNormFunction

    return LigerModulatedRMSNormFunction


def liger_modulated(function, x, w, shift_rows, scale_rows, eps: float):
    # in_place=False: in-place writes dX over the upstream gradient, which the probes reuse
    return function.apply(x, w, scale_rows, shift_rows, eps, 0.0, "llama", False)


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    eps = params.eps
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (Triton kernel), got device {device}")
    function = load_liger_function()

    def fn(x, w, sh, sc, idx):
        return liger_modulated(function, x, w, sh.index_select(0, idx), sc.index_select(0, idx), eps)

    return Loaded(fn=fn, source=f"Liger {liger_version()} modulated RMSNorm + index_select")


ADAPTER = Adapter(name="liger", op="norm_modulate", grads=("x", "w", "sh", "sc"), load=_load,
                  summary="Liger LigerModulatedRMSNormFunction on index_select-gathered rows")
