"""Transformer Engine's `RMSNorm` alone (no modulation): gradient for x only.

TE's backward reads the module's own weight, so w is copied into it before every call
(a functional call with w gives a wrong dx); the weight's gradient then lands on TE's parameter
and is not reported. One module per (hidden size, device, eps), bf16 parameters.
"""
from __future__ import annotations

import torch

from h3bench.adapters._transformer_engine import import_te_pytorch, te_version
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.norm_modulate import NormModulateParams


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    eps = params.eps
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA, got device {device}")
    te = import_te_pytorch()
    modules: dict = {}

    def fn(x, w, sh, sc, idx):
        key = (w.shape[0], x.device, eps)
        module = modules.get(key)
        if module is None:
            module = modules[key] = te.RMSNorm(w.shape[0], eps=eps, params_dtype=torch.bfloat16,
                                               device=x.device)
        with torch.no_grad():
            module.weight.copy_(w)
        return module(x)

    return Loaded(fn=fn, source=f"TE {te_version()} RMSNorm (no modulation)")


ADAPTER = Adapter(name="transformer_engine", op="norm_modulate", grads=("x",), load=_load,
                  summary="Transformer Engine RMSNorm alone, w copied into the module", reference="rms_norm")
