"""The MiniMax-H3 DiT block composed of the reference compositions of the RFC's seven ops (as their
diffusers rows replay them: adapters/<op>/diffusers.py), each in a module named after its op, for
`h3bench model docs/examples/h3_block.py:build`: three samples of eight tokens, each with its timestep; a
sample is a row. The attention is left out: the block's own ops are the subject."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, FREQ, EPS = 64, 32, 1e-5


class TimestepSinusoid(nn.Module):
    def forward(self, t):
        half = FREQ // 2
        exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half
        emb = t[:, None].float() * torch.exp(exponent)[None, :]
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        return torch.cat([emb[:, half:], emb[:, :half]], dim=-1)


class TimestepMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(FREQ, HIDDEN), nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


class AdaLNProjection(nn.Module):
    def __init__(self, chunks: int):
        super().__init__()
        self.linear = nn.Linear(HIDDEN, chunks * HIDDEN)

    def forward(self, temb):
        return self.linear(F.silu(temb))


class AdaLNRowGather(nn.Module):
    """table.chunk(6) and each chunk per token: here a token's row of the table is its sample's."""

    def forward(self, table, tokens: int):
        idx = torch.arange(table.shape[0], device=table.device).repeat_interleave(tokens)
        return tuple(chunk.index_select(0, idx) for chunk in table.chunk(6, dim=-1))


class NormModulate(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x, scale, shift):
        return F.rms_norm(x, (HIDDEN,), self.weight, EPS) * (1 + scale) + shift


class GateResidual(nn.Module):
    def forward(self, res, gate, y):
        return res + gate * y


class FinalAdaLNOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.weight = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x, temb, idx):
        shift, scale = self.linear(F.silu(temb)).chunk(2, dim=-1)
        return F.rms_norm(x, (HIDDEN,), self.weight, EPS) * (1 + scale.index_select(0, idx)) + shift.index_select(0, idx)


class H3Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.timestep_sinusoid, self.timestep_mlp = TimestepSinusoid(), TimestepMLP()
        self.adaln_projection, self.adaln_row_gather = AdaLNProjection(6), AdaLNRowGather()
        self.norm_modulate_1, self.norm_modulate_2 = NormModulate(), NormModulate()
        self.ff_in, self.ff_out = nn.Linear(HIDDEN, 2 * HIDDEN), nn.Linear(2 * HIDDEN, HIDDEN)
        self.mix = nn.Linear(HIDDEN, HIDDEN)
        self.gate_residual = GateResidual()
        self.final_adaln_out = FinalAdaLNOut()

    def forward(self, x, t):
        rows, tokens, _ = x.shape
        temb = self.timestep_mlp(self.timestep_sinusoid(t))
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaln_row_gather(self.adaln_projection(temb), tokens)
        h = x.reshape(rows * tokens, HIDDEN)
        h = self.gate_residual(h, gate1, self.mix(self.norm_modulate_1(h, scale1, shift1)))
        y = self.ff_out(F.gelu(self.ff_in(self.norm_modulate_2(h, scale2, shift2)), approximate="tanh"))
        h = self.gate_residual(h, gate2, y)
        idx = torch.arange(rows, device=x.device).repeat_interleave(tokens)
        return self.final_adaln_out(h, temb, idx).reshape(rows, tokens, HIDDEN)


def build(device):
    torch.manual_seed(0)
    model = H3Block().to(device)
    gen = torch.Generator().manual_seed(1)
    examples = {"x": torch.randn(3, 8, HIDDEN, generator=gen).to(device).requires_grad_(),
                "t": torch.rand(3, generator=gen).mul(1000).to(device)}
    return model, examples, ["x", "t"]
