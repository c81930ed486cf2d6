"""timestep_sinusoid in Triton: out = [cos(t f), sin(t f)] in one launch, correctly rounded to fp32.

    f_k = exp(-ln(max_period) * k / (half - shift)),  k = 0 .. half-1,   out[r] = [cos(t_r f), sin(t_r f)]

Accuracy: the frequencies are computed once per (device, constants) in float64 and kept in float64
(`frequencies`); in the kernel t is widened to float64 (exact), the angle t * f_k is one float64
product (relative error <= 2^-53) and cos / sin are float64 (CUDA libdevice `__nv_cos` / `__nv_sin`,
< 2 ulp of float64; numpy's under the interpreter). The only fp32 rounding is the store, so
|out - exact| <= 2^-25 |out| + (a few float64 ulps): max|out - ref| / max|ref| < 1e-7 against the
float64 reference for every t and k (tests/test_kernel_timestep_sinusoid.py checks it over many t).
(An fp32 angle t * fp32(f) alone would err by up to 2 fp32 roundings of the angle, ~1.2e-7 near
angle 1, before the sine's own error.)

Grid: one program per ROWS rows; each computes a [ROWS, BLOCK_K] block of angles and stores the cosines
at columns k and the sines at half + k. Every element is one fixed sequence of operations on (t_r, f_k):
bitwise the same alone or in any batch. The launch path (checks, the kept recipes) is
kernels/timestep_sinusoid_api.py.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from h3bench.kernels.common import INTERPRETED, next_power_of_2

try:
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - every supported triton has it
    libdevice = None



@dataclass(frozen=True)
class LaunchConfig:
    """The block shape: [rows, next_pow2(freq_dim / 2)] angles per program on `warps` warps (both powers of
    two). Any shape gives the same bits (each element is one fixed float64 sequence): tests pass small
    blocks to check that."""
    rows: int    # rows per program
    warps: int


@functools.lru_cache(maxsize=64)
def launch_config(freq_dim: int) -> LaunchConfig:
    """The default for `freq_dim` features (`config_for`)."""
    return config_for(freq_dim, INTERPRETED)


def config_for(freq_dim: int, interpreted: bool) -> LaunchConfig:
    """On a GPU: [8, 128] angle blocks (4 warps, 8 angles per thread) at the model's 256 features. The
    per-sample latency is the host's at every T: on the H200 blocks of [4|2|1, 128] on 2 or 4 warps came
    within the host's jitter of this one at T = 1 and 2048, none measurably faster
    (kernels/notes/timestep_sinusoid.md). The interpreter runs programs one after another at a fixed
    Python cost each: large blocks there."""
    half_p2 = next_power_of_2(max(1, freq_dim // 2))
    return LaunchConfig(rows=max(1, (65536 if interpreted else 1024) // half_p2), warps=4)


@triton.jit(do_not_specialize=["n_rows", "stride_t"], do_not_specialize_on_alignment=["T"])
def _sinusoid_kernel(T, FREQ, OUT, n_rows, stride_t, HALF: tl.constexpr, BLOCK_K: tl.constexpr,
                     ROWS: tl.constexpr, INTERPRETED: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < n_rows
    k_ok = ks < HALF
    t = tl.load(T + rows * stride_t, mask=row_ok, other=0.0).to(tl.float64)
    f = tl.load(FREQ + ks, mask=k_ok, other=0.0)
    angle = t[:, None] * f[None, :]
    if INTERPRETED:  # the interpreter has no libdevice: numpy's float64 cos / sin
        c = tl.cos(angle)
        s = tl.sin(angle)
    else:  # tl.cos / tl.sin may lower to approximate instructions: ask libdevice for float64 ones
        c = libdevice.cos(angle)
        s = libdevice.sin(angle)
    mask = row_ok[:, None] & k_ok[None, :]
    out = OUT + rows.to(tl.int64)[:, None] * (2 * HALF) + ks[None, :]
    tl.store(out, c.to(tl.float32), mask=mask)
    tl.store(out + HALF, s.to(tl.float32), mask=mask)


_FREQS: dict = {}


def frequencies(device: torch.device, half: int, max_period: float, shift: float) -> torch.Tensor:
    """f_k in float64 on `device`, computed once per (device, constants) as the float64 reference does."""
    key = (device, half, max_period, shift)
    found = _FREQS.get(key)
    if found is None:
        k = torch.arange(half, dtype=torch.float64, device=device)
        found = _FREQS[key] = torch.exp(-math.log(max_period) * k / (half - shift)).contiguous()
    return found








