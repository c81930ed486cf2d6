"""Quack's `softmax(x)` (Dao-AILab's CuTe DSL kernels, quack-kernels): an autograd Function over its forward
and backward kernels, for 2-D [M, N] input in fp32, bf16 or fp16, the output in x's dtype. Gradient for x.
Imported through adapters/_quack.py."""
from __future__ import annotations

import torch

from h3bench.adapters._quack import import_quack, quack_source
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.softmax import SoftmaxParams


def _load(device: torch.device, params: SoftmaxParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (CuTe DSL kernel), got device {device}")
    quack_softmax = import_quack().softmax

    def softmax(x):
        return quack_softmax(x)

    return Loaded(fn=softmax, source=quack_source("softmax"))


ADAPTER = Adapter(name="quack", op="softmax", grads=("x",), load=_load, summary="Quack CuTe DSL softmax")
