"""h3bench's own Triton kernel (kernels/norm_modulate_kernel.py): fused, batch-invariant, deterministic."""
from __future__ import annotations

from importlib import metadata

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.norm_modulate import NormModulateParams


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    from h3bench.kernels.common import interpreter_active, require_triton_device
    from h3bench.kernels.norm_modulate_api import GRAPHS, norm_modulate

    require_triton_device(device)
    eps = params.eps

    def fused(x, w, sh, sc, idx):
        # The range check is a host sync; rows with a bad index come out NaN instead (never silent).
        return norm_modulate(x, w, sh, sc, idx, eps, check_index=False)

    where = "Triton interpreter" if interpreter_active() else "CUDA"
    return Loaded(fn=fused, source=f"h3bench Triton norm_modulate (triton {metadata.version('triton')}, "
                                   f"{where}; index range check off{GRAPHS.described(device)})")


ADAPTER = Adapter(name="h3bench_triton", op="norm_modulate", grads=("x", "w", "sh", "sc"), load=_load,
                  summary="h3bench's fused Triton kernel")
