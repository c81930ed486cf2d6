"""h3bench's own Triton gate_residual (kernels/gate_residual_kernel.py): one-pass forward, one-launch backward
(dres, dy and the gate partials) plus a fixed-order partial sum for the gate gradient."""
from __future__ import annotations

from importlib import metadata

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.gate_residual import OP, GateResidualParams


def _load(device: torch.device, params: GateResidualParams) -> Loaded:
    from h3bench.kernels.common import interpreter_active, require_triton_device
    from h3bench.kernels.gate_residual_api import gate_residual

    require_triton_device(device)

    def fused(res, y, gate, idx):
        # The range check is a host sync; rows with a bad index come out NaN instead (never silent).
        return gate_residual(res, y, gate, idx, check_index=False)

    where = "Triton interpreter" if interpreter_active() else "CUDA"
    return Loaded(fn=fused, source=f"h3bench Triton gate_residual (triton {metadata.version('triton')}, "
                                   f"{where}; index range check off)")


ADAPTER = Adapter(name="h3bench_triton", op="gate_residual", grads=OP.differentiable, load=_load,
                  summary="h3bench's fused Triton kernel with a fixed-order gate gradient")
