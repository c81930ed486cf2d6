"""`F.rms_norm(x, (H,), w, eps)`: torch's own RMSNorm, the op's plain composition (the negative control's
too), gradients for x and w from autograd."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.rms_norm import RmsNormParams


def _load(device: torch.device, params: RmsNormParams) -> Loaded:
    import torch.nn.functional as F

    eps = params.eps

    def rms_norm(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    return Loaded(fn=rms_norm, source=f"torch {torch.__version__} F.rms_norm")


ADAPTER = Adapter(name="torch", op="rms_norm", grads=("x", "w"), load=_load, summary="torch F.rms_norm")
