"""Liger's fused modulated RMSNorm on rows gathered by h3bench's deterministic row gather
(kernels/row_gather.py): the liger_rlk_gather row's result without rl-kernel."""
from __future__ import annotations

import torch

from h3bench.adapters.norm_modulate.liger import liger_modulated, liger_version, load_liger_function
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.norm_modulate import NormModulateParams


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    eps = params.eps
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (Liger's Triton kernel), got device {device}")
    function = load_liger_function()
    from h3bench.kernels.row_gather import deterministic_row_gather

    def fn(x, w, sh, sc, idx):
        return liger_modulated(function, x, w, deterministic_row_gather(sh, idx), deterministic_row_gather(sc, idx),
                               eps)

    return Loaded(fn=fn, source=f"Liger {liger_version()} modulated RMSNorm + h3bench deterministic row gather "
                                f"(kernels/row_gather.py)")


ADAPTER = Adapter(name="liger_det_gather", op="norm_modulate", grads=("x", "w", "sh", "sc"), load=_load,
                  summary="Liger on rows from h3bench's deterministic (atomic-free, fixed-order) row gather")
