"""`F.rms_norm` alone: the norm without modulation, gradients for x and w."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.norm_modulate import NormModulateParams


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    eps = params.eps
    import torch.nn.functional as F

    def norm_only(x, w, sh, sc, idx):
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    return Loaded(fn=norm_only, source="torch F.rms_norm (no modulation)")


ADAPTER = Adapter(name="torch_rms_norm", op="norm_modulate", grads=("x", "w"), load=_load,
                  summary="F.rms_norm alone", reference="rms_norm")
