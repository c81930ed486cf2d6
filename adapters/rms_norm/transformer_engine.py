"""Transformer Engine's `te.pytorch.RMSNorm(H, eps=eps, params_dtype=w.dtype, device=x.device)`, w copied
into the module before every call (adapters/_transformer_engine.py: TE's backward reads its own weight);
gradients for x and w, w's as TE's backward reduced it into its own parameter."""
from __future__ import annotations

import torch

from h3bench.adapters._transformer_engine import import_te_pytorch, te_version, with_parameters
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.rms_norm import RmsNormParams


def _load(device: torch.device, params: RmsNormParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA, got device {device}")
    te = import_te_pytorch()
    eps, dtype = params.eps, params.torch_dtype
    call = with_parameters(lambda x: te.RMSNorm(x.shape[-1], eps=eps, params_dtype=dtype, device=x.device),
                           ("weight",))

    def rms_norm(x, w):
        return call(x, w)

    return Loaded(fn=rms_norm, source=f"TE {te_version()} RMSNorm (w copied into the module)")


ADAPTER = Adapter(name="transformer_engine", op="rms_norm", grads=("x", "w"), load=_load,
                  summary="Transformer Engine RMSNorm, w copied into the module")
