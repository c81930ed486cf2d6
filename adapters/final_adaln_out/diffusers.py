"""diffusers' `MiniMaxH3AdaLayerNormOut` (`norm_out`, diffusers 0.42.1), replayed op for op:

    shift, scale = self.linear(nn.functional.silu(temb).to(get_parameter_dtype(self.linear))).chunk(2, dim=-1)
    hidden_states = self.norm(hidden_states)
    return hidden_states * (1.0 + scale.index_select(0, timestep_indices)) + shift.index_select(0, timestep_indices)

`self.linear` is `nn.Linear(D, 2H)` (F.linear with W, b), `self.norm` is `nn.RMSNorm(H, eps)` (F.rms_norm with
nw). dtypes: silu in temb's float32, one cast to W's bf16, the projection, norm and modulation in bf16; shift
is the first half. The model's later cast of the output to the float32 heads is outside the op.
"""
from __future__ import annotations

import torch

from h3bench.adapters._diffusers import diffusers_installed
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.final_adaln_out import FinalAdaLNOutParams


def _load(device: torch.device, params: FinalAdaLNOutParams) -> Loaded:
    eps = params.eps
    import torch.nn.functional as F

    def norm_out(x, nw, temb, W, b, ti):
        shift, scale = F.linear(F.silu(temb).to(W.dtype), W, b).chunk(2, dim=-1)
        hidden_states = F.rms_norm(x, (x.shape[-1],), nw, eps)
        return hidden_states * (1.0 + scale.index_select(0, ti)) + shift.index_select(0, ti)

    return Loaded(fn=norm_out,
                  source=("diffusers MiniMaxH3AdaLayerNormOut replayed (F.linear(F.silu(temb).to(bf16)), chunk, "
                          f"F.rms_norm, index_select modulation){diffusers_installed()}"))


ADAPTER = Adapter(name="diffusers", op="final_adaln_out", grads=("x", "nw", "temb", "w", "b"), load=_load,
                  summary="diffusers' MiniMaxH3AdaLayerNormOut: F.linear + chunk + F.rms_norm + index_select")
