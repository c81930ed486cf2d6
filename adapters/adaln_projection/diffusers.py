"""diffusers' `MiniMaxH3AdaLayerNormModulation` projection, replayed op for op.

MiniMaxH3AdaLayerNormModulation.forward (diffusers 0.42.1, transformers/transformer_minimax_h3.py):

    temb = self.linear(nn.functional.silu(temb).to(get_parameter_dtype(self.linear)))
    temb = temb.view(-1, 6 * self.hidden_size)
    return temb.chunk(6, dim=-1)

with `self.linear = nn.Linear(time_embed_dim, 6 * hidden_size * MINIMAX_H3_MODALITY_NUM)` in bf16: silu at
temb's fp32, then the cast to bf16, then a bf16 F.linear. The op's output is the linear's [T, 18H] result;
the view and chunk that follow are free (no copy). Torch only.
"""
from __future__ import annotations

import torch

from h3bench.adapters._diffusers import diffusers_installed
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.adaln_projection import AdaLNProjectionParams


def _load(device: torch.device, params: AdaLNProjectionParams) -> Loaded:
    import torch.nn.functional as F

    def projection(temb, w, b):
        return F.linear(F.silu(temb).to(w.dtype), w, b)

    return Loaded(fn=projection, source=("diffusers MiniMaxH3AdaLayerNormModulation projection (op-for-op replay "
                                         "of diffusers 0.42.1: F.silu in fp32, cast to bf16, bf16 F.linear)"
                                         f"{diffusers_installed()}"))


ADAPTER = Adapter(name="diffusers", op="adaln_projection", grads=("temb", "w", "b"), load=_load,
                  summary="diffusers' AdaLN projection replayed: F.linear(F.silu(temb).to(bf16), W, b)")
