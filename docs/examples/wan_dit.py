"""Wan2.1's DiT (diffusers' WanTransformer3DModel), built from a config in code at reduced depth and width
(one block, random weights, no download), for `h3bench model docs/examples/wan_dit.py:build`: two latent
videos, each with its timestep and text embedding, each video a row."""
from __future__ import annotations

import torch


def build(device):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                  out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=1,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    model = model.to(device).eval()
    gen = torch.Generator().manual_seed(1)
    rows = 2
    examples = {"hidden_states": torch.randn(rows, 4, 2, 8, 8, generator=gen).to(device).requires_grad_(),
                "timestep": torch.randint(0, 1000, (rows,), generator=gen).float().to(device),
                "encoder_hidden_states": torch.randn(rows, 6, 32, generator=gen).to(device)}
    return model, examples, ["hidden_states", "timestep", "encoder_hidden_states"]
