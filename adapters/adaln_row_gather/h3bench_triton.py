"""h3bench's own Triton adaln_row_gather (kernels/adaln_row_gather_kernel.py): one-launch gather-copy forward,
fixed-order atomic-free table gradient."""
from __future__ import annotations

from importlib import metadata

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.adaln_row_gather import OP, AdaLNRowGatherParams


def _load(device: torch.device, params: AdaLNRowGatherParams) -> Loaded:
    from h3bench.kernels.adaln_row_gather_api import adaln_row_gather
    from h3bench.kernels.common import interpreter_active, require_triton_device

    require_triton_device(device)
    modalities, chunks = params.modalities, params.chunks

    def gather(table, ti, tag):
        # The range check is a host sync; rows with a bad index come out NaN instead (never silent).
        return adaln_row_gather(table, ti, tag, modalities, chunks, check_index=False)

    where = "Triton interpreter" if interpreter_active() else "CUDA"
    return Loaded(fn=gather, source=f"h3bench Triton adaln_row_gather (triton {metadata.version('triton')}, "
                                    f"{where}; index range check off)")


ADAPTER = Adapter(name="h3bench_triton", op="adaln_row_gather", grads=OP.differentiable, load=_load,
                  summary="h3bench's Triton gather-copy with a fixed-order table gradient")
