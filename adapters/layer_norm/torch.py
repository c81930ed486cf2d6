"""`F.layer_norm(x.float(), (H,), w.float(), b.float(), eps).to(x.dtype)`: torch's own LayerNorm as
diffusers' FP32LayerNorm calls it (the module the op's shape comes from: harness/ops/layer_norm.py), the
op's plain composition (the negative control's too), gradients for x, w and b from autograd. The casts are
the model's, and they are needed: on CUDA, F.layer_norm of bf16 x with fp32 w and b raises "expected scalar
type BFloat16 but found Float" (an H100, torch 2.11; the CPU's kernel accepts the mix). Where x, w and b
share a dtype the casts cost nothing in fp32 and compute a bf16 config in fp32, as FP32LayerNorm does."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.layer_norm import LayerNormParams


def _load(device: torch.device, params: LayerNormParams) -> Loaded:
    import torch.nn.functional as F

    eps = params.eps

    def layer_norm(x, w, b):
        return F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), eps).to(x.dtype)

    return Loaded(fn=layer_norm, source=f"torch {torch.__version__} F.layer_norm in fp32 (diffusers' FP32LayerNorm)")


ADAPTER = Adapter(name="torch", op="layer_norm", grads=("x", "w", "b"), load=_load,
                  summary="torch F.layer_norm")
