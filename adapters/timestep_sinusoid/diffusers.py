"""diffusers' `Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)`, replayed op for op.

MiniMaxH3Transformer3DModel's `time_proj` calls `get_timestep_embedding` (diffusers 0.42.1,
models/embeddings.py), whose ops are, in this order and these dtypes:

    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(start=0, end=half_dim, dtype=torch.float32, device=...)
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = torch.exp(exponent)
    emb = timesteps[:, None].float() * emb[None, :]
    emb = scale * emb                                  # scale = 1 (Timesteps' default)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)

(and a zero pad for odd widths, which the op's even freq_dim never takes). The replay below runs exactly
these tensor ops, so it launches the kernels diffusers does on any device; it needs torch only.
"""
from __future__ import annotations

import math

import torch

from h3bench.adapters._diffusers import diffusers_installed
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.timestep_sinusoid import TimestepSinusoidParams

SCALE = 1  # Timesteps(..., scale=1): the MiniMax-H3 model leaves the default


def _load(device: torch.device, params: TimestepSinusoidParams) -> Loaded:
    embedding_dim, max_period, shift = params.freq_dim, params.max_period, params.downscale_freq_shift

    def time_proj(t):
        half_dim = embedding_dim // 2
        exponent = -math.log(max_period) * torch.arange(start=0, end=half_dim, dtype=torch.float32, device=t.device)
        exponent = exponent / (half_dim - shift)
        emb = torch.exp(exponent)
        emb = t[:, None].float() * emb[None, :]
        emb = SCALE * emb
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)  # flip_sin_to_cos=True
        return emb

    return Loaded(fn=time_proj, source=("diffusers Timesteps / get_timestep_embedding (op-for-op replay of "
                                        f"diffusers 0.42.1, flip_sin_to_cos=True){diffusers_installed()}"))


ADAPTER = Adapter(name="diffusers", op="timestep_sinusoid", grads=(), load=_load,
                  summary="diffusers' get_timestep_embedding replayed op for op (fp32 exponent, sin/cat, "
                          "halves swapped)")
