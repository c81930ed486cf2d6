"""A plain-torch RMSNorm to run as a row of docs/examples/rms_norm_op.py's op:

    h3bench run --op docs/examples/rms_norm_op.py:RMS_NORM --adapter docs/examples/rms_norm_impl.py:rms_norm

It takes the op's inputs in call order and, as a keyword argument, the constant it names (eps: the run's
value, so `--set eps=1e-5` reaches it). As most RMSNorms do, it computes in float32 and rounds once to
the input's dtype; each row's reduction runs over that row alone, so a row's bits do not depend on its batch.
"""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, *, eps: float) -> torch.Tensor:
    wide = x.float()
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)
