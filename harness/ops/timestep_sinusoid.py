"""timestep_sinusoid, the MiniMax-H3 sinusoidal timestep features (RL-Align/RL-Kernel RFC #420).

    f_k = exp(-ln(max_period) * k / (half - downscale_freq_shift)),  k = 0 .. half-1,  half = freq_dim / 2
    out = [cos(t * f), sin(t * f)]                                     t: [T] -> out: [T, freq_dim]

diffusers' `Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)`: cosines first (flip_sin_to_cos
is fixed by the op, not a constant), no zero pad (freq_dim must be even), scale 1. At the model's
constants (freq_dim 256, max_period 10000, shift 0) this is
f_k = exp(-ln(10000) k / 128) (docs/operators.md, timestep_sinusoid).

One per-row input, t in [0, 1) (uniform, fp32, drawn on the target device from the case seed); one fp32
output; no gradients (the op is forward only, mode plain). The upstream gradient `make_grad_outs` returns
is never used for a backward: the probes check output shapes against it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (Input, Op, OpInputs, Reference, Traffic, element_size, float64_leaves, generator,
                              positive)

DTYPE = torch.float32  # t and out (docs/operators.md, timestep_sinusoid); the sinusoid has no other dtype


@dataclass(frozen=True)
class TimestepSinusoidParams:
    freq_dim: int                 # output width: half cosines, half sines (256)
    max_period: int               # the slowest period (10000)
    downscale_freq_shift: float   # the frequency exponent divides by half - shift (0)

    def __post_init__(self):
        positive("freq_dim", self.freq_dim)
        if self.freq_dim % 2:
            raise ValueError(f"freq_dim must be even (half cosines, half sines), got {self.freq_dim}")
        if self.max_period < 2:
            raise ValueError(f"max_period must be >= 2, got {self.max_period}")
        if not self.downscale_freq_shift < self.half:
            raise ValueError(f"downscale_freq_shift must be < freq_dim / 2 = {self.half} (it divides the "
                             f"exponent by freq_dim / 2 - shift), got {self.downscale_freq_shift}")

    @property
    def half(self) -> int:
        return self.freq_dim // 2


def sinusoid64(t: torch.Tensor, params: TimestepSinusoidParams) -> torch.Tensor:
    """The op in float64, no intermediate rounding: [cos(t f), sin(t f)]."""
    k = torch.arange(params.half, dtype=torch.float64, device=t.device)
    freqs = torch.exp(-math.log(params.max_period) * k / (params.half - params.downscale_freq_shift))
    angle = t.double()[:, None] * freqs[None, :]
    return torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)


class TimestepSinusoid(Op):
    name = "timestep_sinusoid"
    inputs = (Input("t", per_row=True, shape=("R",)),)
    outputs = ("out",)
    output_shapes = (("R", "freq_dim"),)
    formula = ("out = [cos(t * f), sin(t * f)], f[k] = exp(-ln(max_period) * k / (freq_dim/2 - "
               "downscale_freq_shift)), k < freq_dim/2")
    params_type = TimestepSinusoidParams
    plan_set = "sinusoid"
    constants = ("freq_dim", "max_period", "downscale_freq_shift")

    def make_inputs(self, params: TimestepSinusoidParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        t = torch.rand(rows, generator=generator(device, seed), device=device, dtype=DTYPE)
        return self.bundle({"t": t})

    def make_grad_outs(self, params: TimestepSinusoidParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        gen = generator(device, seed)
        return (torch.randn(rows, params.freq_dim, generator=gen, device=device, dtype=DTYPE),)

    def reference(self, params: TimestepSinusoidParams, inputs: OpInputs,
                  grad_outs: Optional[tuple[torch.Tensor, ...]], grads: tuple[str, ...], variant: str) -> Reference:
        self.check_variant(variant)
        unknown = [g for g in grads if g not in self.differentiable]
        if unknown:
            raise ValueError(f"{self.name} has no gradients; asked for {unknown}")
        leaves = float64_leaves(inputs, self.differentiable, grads, False)
        return Reference(outputs=(sinusoid64(leaves["t"], params),), grads={})

    def floor_traffic(self, params: TimestepSinusoidParams, rows: int, backward: bool) -> Traffic:
        """fp32 (4 B). Per row: read t (4 B), write out (4 * freq_dim B: 1024 B at 256 wide); no fixed bytes
        (the frequencies are computed, not read). The op has no backward, so `backward` changes nothing."""
        size = element_size(DTYPE)
        return Traffic(read=rows * size, written=rows * size * params.freq_dim)


OP = TimestepSinusoid()
