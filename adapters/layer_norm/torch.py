"""`F.layer_norm(x, (H,), w, b, eps)`: torch's own LayerNorm, the op's plain composition (the negative
control's too), gradients for x, w and b from autograd. With bf16 x and fp32 w, b (the default config) torch
takes the mixed-dtype path, computing in fp32 and returning x's dtype, as diffusers' FP32LayerNorm does by
casting x up and the output back."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.layer_norm import LayerNormParams


def _load(device: torch.device, params: LayerNormParams) -> Loaded:
    import torch.nn.functional as F

    eps = params.eps

    def layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)

    return Loaded(fn=layer_norm, source=f"torch {torch.__version__} F.layer_norm")


ADAPTER = Adapter(name="torch", op="layer_norm", grads=("x", "w", "b"), load=_load,
                  summary="torch F.layer_norm")
