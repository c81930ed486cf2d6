"""The composition diffusers' MiniMax-H3 block runs: F.rms_norm, then index_select modulation."""
from __future__ import annotations

import torch

from h3bench.adapters._diffusers import diffusers_installed
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.norm_modulate import NormModulateParams


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    eps = params.eps
    import torch.nn.functional as F

    def composition(x, w, sh, sc, idx):
        n = F.rms_norm(x, (x.shape[-1],), w, eps)
        return n * (1 + sc.index_select(0, idx)) + sh.index_select(0, idx)

    return Loaded(fn=composition,
                  source=f"diffusers composition (F.rms_norm + index_select modulation){diffusers_installed()}")


ADAPTER = Adapter(name="diffusers", op="norm_modulate", grads=("x", "w", "sh", "sc"), load=_load,
                  summary="F.rms_norm + index_select modulation, as diffusers' MiniMaxH3TransformerBlock")
