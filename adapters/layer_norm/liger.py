"""Liger's LayerNorm (liger-kernel's Triton kernel), called as its functional API
`liger_kernel.transformers.functional.liger_layer_norm(X, W, B, eps)` calls it:
`LigerLayerNormFunction.apply(X, W, B, eps)`, imported from `liger_kernel.ops` (liger_kernel.transformers'
package imports its model patches, which need `transformers`). The output is in x's dtype; dw and db are
summed from per-SM fp32 partials. Gradients for x, w and b."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded, installed_version
from h3bench.harness.ops.layer_norm import LayerNormParams


def _load(device: torch.device, params: LayerNormParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (Triton kernel), got device {device}")
    from liger_kernel.ops import LigerLayerNormFunction

    eps = params.eps

    def layer_norm(x, w, b):
        return LigerLayerNormFunction.apply(x, w, b, eps)

    return Loaded(fn=layer_norm, source=f"Liger {installed_version('liger-kernel')} LigerLayerNormFunction")


ADAPTER = Adapter(name="liger", op="layer_norm", grads=("x", "w", "b"), load=_load,
                  summary="Liger LayerNorm (liger_layer_norm's autograd Function)")
