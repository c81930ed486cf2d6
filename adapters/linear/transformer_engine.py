"""Transformer Engine's `te.pytorch.Linear(K, N, bias=False, params_dtype=w.dtype, device=x.device)`, w
copied into the module before every call (adapters/_transformer_engine.py): its cuBLASLt GEMMs outside
FP8; gradients for x and w, dW as TE's backward computed it for its own parameter."""
from __future__ import annotations

import torch

from h3bench.adapters._transformer_engine import import_te_pytorch, te_version, with_parameters
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.linear import LinearParams


def _load(device: torch.device, params: LinearParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA, got device {device}")
    te = import_te_pytorch()
    k, n, dtype = params.in_features, params.out_features, params.torch_dtype
    call = with_parameters(lambda x: te.Linear(k, n, bias=False, params_dtype=dtype, device=x.device),
                           ("weight",))

    def linear(x, w):
        return call(x, w)

    return Loaded(fn=linear, source=f"TE {te_version()} Linear (no bias, w copied into the module)")


ADAPTER = Adapter(name="transformer_engine", op="linear", grads=("x", "w"), load=_load,
                  summary="Transformer Engine Linear, w copied into the module")
