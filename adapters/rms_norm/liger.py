"""Liger's RMSNorm (liger-kernel's Triton kernel), called as its functional API
`liger_kernel.transformers.functional.liger_rms_norm(X, W, eps, offset=0.0, casting_mode="llama",
in_place=True)` calls it: `LigerRMSNormFunction.apply(X, W, eps, offset, casting_mode, in_place)`, imported
from `liger_kernel.ops` (liger_kernel.transformers' package imports its model patches, which need
`transformers`). offset 0 and casting mode "llama" as LigerRMSNorm's defaults (Llama's RMSNorm: the norm in
fp32, cast to x's dtype before the weight); in_place=False: in place, the backward writes dx over the
upstream gradient, which the probes reuse. Gradients for x and w."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded, installed_version
from h3bench.harness.ops.rms_norm import RmsNormParams

OFFSET, CASTING_MODE, IN_PLACE = 0.0, "llama", False


def _load(device: torch.device, params: RmsNormParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (Triton kernel), got device {device}")
    from liger_kernel.ops import LigerRMSNormFunction

    eps = params.eps

    def rms_norm(x, w):
        return LigerRMSNormFunction.apply(x, w, eps, OFFSET, CASTING_MODE, IN_PLACE)

    return Loaded(fn=rms_norm, source=(f"Liger {installed_version('liger-kernel')} LigerRMSNormFunction "
                                       f"(offset {OFFSET}, casting_mode {CASTING_MODE!r}, in_place {IN_PLACE})"))


ADAPTER = Adapter(name="liger", op="rms_norm", grads=("x", "w"), load=_load,
                  summary="Liger RMSNorm (liger_rms_norm's autograd Function)")
