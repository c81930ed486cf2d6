"""diffusers' `TimestepEmbedding(256, 5376, out_dim=2688)`, replayed op for op (fp32).

In MiniMaxH3Transformer3DModel.forward (diffusers 0.42.1, transformers/transformer_minimax_h3.py):

    temb = self.time_embedder(temb.to(get_parameter_dtype(self.time_embedder)))

and TimestepEmbedding.forward (models/embeddings.py; act_fn "silu" is nn.SiLU, no cond_proj, no post_act):

    sample = self.linear_1(sample)     # nn.Linear: F.linear(sample, weight, bias)
    sample = self.act(sample)          # nn.SiLU: F.silu(sample)
    sample = self.linear_2(sample)

The replay runs F.linear, F.silu, F.linear on the op's tensors (the cast to the module's dtype is a no-op
at fp32 and kept for fidelity), so every global mode that replaces aten's GEMMs applies to it. Torch only.
"""
from __future__ import annotations

import torch

from h3bench.adapters._diffusers import diffusers_installed
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.timestep_mlp import TimestepMLPParams


def _load(device: torch.device, params: TimestepMLPParams) -> Loaded:
    import torch.nn.functional as F

    def time_embedder(x, w1, b1, w2, b2):
        sample = F.linear(x.to(w1.dtype), w1, b1)
        sample = F.silu(sample)
        return F.linear(sample, w2, b2)

    return Loaded(fn=time_embedder, source=("diffusers TimestepEmbedding (op-for-op replay of diffusers 0.42.1: "
                                            f"F.linear, F.silu, F.linear; fp32){diffusers_installed()}"))


ADAPTER = Adapter(name="diffusers", op="timestep_mlp", grads=("x", "w1", "b1", "w2", "b2"), load=_load,
                  summary="diffusers' TimestepEmbedding replayed: F.linear, F.silu, F.linear in fp32")
