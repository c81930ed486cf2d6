"""h3bench's own Triton AdaLN projection (kernels/adaln_projection_kernel.py): bf16 tensor-core GEMMs with one
tile config for every T, batch-invariant, deterministic weight gradients."""
from __future__ import annotations

from importlib import metadata

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.adaln_projection import AdaLNProjectionParams


def _load(device: torch.device, params: AdaLNProjectionParams) -> Loaded:
    from h3bench.kernels.adaln_projection_api import adaln_projection
    from h3bench.kernels.common import interpreter_active, require_triton_device

    require_triton_device(device)
    where = "Triton interpreter" if interpreter_active() else "CUDA"
    return Loaded(fn=adaln_projection, source=f"h3bench Triton adaln_projection (triton "
                                              f"{metadata.version('triton')}, {where}; bf16 wgmma GEMMs, one "
                                              "tile config for every T)")


ADAPTER = Adapter(name="h3bench_triton", op="adaln_projection", grads=("temb", "w", "b"), load=_load,
                  summary="h3bench's batch-invariant Triton GEMMs (bf16, silu+cast pre-pass, fused bias)")
