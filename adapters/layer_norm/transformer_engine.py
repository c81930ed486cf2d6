"""Transformer Engine's `te.pytorch.LayerNorm(H, eps=eps, params_dtype=w.dtype, device=x.device)`, w and b
copied into the module before every call (adapters/_transformer_engine.py: TE's backward reads its own
parameters); gradients for x, w and b, w's and b's as TE's backward reduced them into its own parameters.

TE computes in its parameters' dtype and returns that dtype (transformer_engine/pytorch/ops/basic/
layer_norm.py: x is cast to the weight's dtype unless autocast is on), so with fp32 parameters the output
is cast back to x's dtype: diffusers' FP32LayerNorm composition (compute in fp32, return the input's dtype)
with TE's kernel inside."""
from __future__ import annotations

import torch

from h3bench.adapters._transformer_engine import import_te_pytorch, te_version, with_parameters
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.layer_norm import LayerNormParams


def _load(device: torch.device, params: LayerNormParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA, got device {device}")
    te = import_te_pytorch()
    eps, param_dtype = params.eps, params.torch_param_dtype
    call = with_parameters(lambda x: te.LayerNorm(x.shape[-1], eps=eps, params_dtype=param_dtype,
                                                  device=x.device), ("weight", "bias"))

    def layer_norm(x, w, b):
        return call(x, w, b).to(x.dtype)

    return Loaded(fn=layer_norm, source=(f"TE {te_version()} LayerNorm ({params.param_dtype} parameters copied "
                                         "into the module; output cast to x's dtype)"))


ADAPTER = Adapter(name="transformer_engine", op="layer_norm", grads=("x", "w", "b"), load=_load,
                  summary="Transformer Engine LayerNorm, w and b copied into the module")
