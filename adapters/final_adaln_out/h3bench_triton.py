"""h3bench's final_adaln_out (kernels/final_adaln_out_kernel.py): the 3-row projection in torch (F.linear, one
autograd node), then h3bench's Triton norm_modulate kernel with shift/scale as the two table halves."""
from __future__ import annotations

from importlib import metadata

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.final_adaln_out import OP, FinalAdaLNOutParams


def _load(device: torch.device, params: FinalAdaLNOutParams) -> Loaded:
    from h3bench.kernels.common import interpreter_active, require_triton_device
    from h3bench.kernels.final_adaln_out_api import final_adaln_out

    require_triton_device(device)
    eps = params.eps

    def norm_out(x, nw, temb, w, b, ti):
        # The range check is a host sync; rows with a bad index come out NaN instead (never silent).
        return final_adaln_out(x, nw, temb, w, b, ti, eps, check_index=False)

    where = "Triton interpreter" if interpreter_active() else "CUDA"
    return Loaded(fn=norm_out, source=(f"h3bench final_adaln_out: torch {torch.__version__} F.linear projection + "
                                       f"Triton norm_modulate (triton {metadata.version('triton')}, {where}; "
                                       "index range check off)"))


ADAPTER = Adapter(name="h3bench_triton", op="final_adaln_out", grads=OP.differentiable, load=_load,
                  summary="torch projection + h3bench's fused Triton norm_modulate")
