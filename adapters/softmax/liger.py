"""Liger's softmax (liger-kernel's Triton kernel) over the last dimension, called as its functional API
`liger_kernel.transformers.functional.liger_softmax(x)` calls it: `LigerSoftmaxFunction.apply(x)`, imported
from `liger_kernel.ops` (liger_kernel.transformers' package imports its model patches, which need
`transformers`). Gradient for x."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded, installed_version
from h3bench.harness.ops.softmax import SoftmaxParams


def _load(device: torch.device, params: SoftmaxParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (Triton kernel), got device {device}")
    from liger_kernel.ops import LigerSoftmaxFunction

    def softmax(x):
        return LigerSoftmaxFunction.apply(x)

    return Loaded(fn=softmax, source=f"Liger {installed_version('liger-kernel')} LigerSoftmaxFunction")


ADAPTER = Adapter(name="liger", op="softmax", grads=("x",), load=_load,
                  summary="Liger softmax (liger_softmax's autograd Function)")
