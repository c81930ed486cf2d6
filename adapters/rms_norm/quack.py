"""Quack's `rmsnorm(x, weight, eps=eps)` (Dao-AILab's CuTe DSL kernels, quack-kernels): an autograd
Function over its `quack::rmsnorm_fwd` and `quack::rmsnorm_bwd_f` custom ops, output in x's dtype, dw from
per-SM partial sums. Gradients for x and w. Imported through adapters/_quack.py."""
from __future__ import annotations

import torch

from h3bench.adapters._quack import import_quack, quack_source
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.rms_norm import RmsNormParams


def _load(device: torch.device, params: RmsNormParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (CuTe DSL kernel), got device {device}")
    rmsnorm = import_quack().rmsnorm
    eps = params.eps

    def rms_norm(x, w):
        return rmsnorm(x, w, eps=eps)

    return Loaded(fn=rms_norm, source=quack_source("rmsnorm"))


ADAPTER = Adapter(name="quack", op="rms_norm", grads=("x", "w"), load=_load, summary="Quack CuTe DSL rmsnorm")
