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
bitwise the same alone or in any batch. float64 costs little here: 2 x 128 sin/cos per row, on an H200
(~34 fp64 TFLOPS) ~1 us of arithmetic at T = 2048; at every T the cost is the host path (H200 VM,
`python -m tools.hostcost --sinusoid-only`: 33.2 us a call at commit 9fb680b, 16.6 of them in
`kernels.common.launch`, SGLang's JIT kernel 15.0; 6.77 us a call on the path below at commit 3c77436,
SGLang's 7.87). So after the first call per (device, constants) a call is: one dictionary lookup,
the dtype and rank of t, one allocation and `kernels.common.launch_ready` (no binder: the kernel's
compiled code depends on t's dtype alone: its integers are not specialized, t's pointer not on
alignment, and the frequencies and the output are our own fresh allocations). From the second call per
t dtype, the entry `launch_ready` made is kept in the recipe and called with the three pointers as ints
(`kernels.common.ready_runner`): no lookup by the constexprs, no data_ptr() calls and pointer checks in the
C launcher (t is on the recipe's CUDA device, the other two are ours).
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from h3bench.kernels import checks
from h3bench.kernels.common import INTERPRETED, fast_launch_allowed, launch_ready, next_power_of_2, ready_runner

try:
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - every supported triton has it
    libdevice = None

_T_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_cuda_device = getattr(torch._C, "_cuda_getDevice", None)  # absent from a CPU-only torch (t.is_cuda never true)
_I32_MAX = (1 << 31) - 1  # the kernel's ints are int32 (not specialized on their value) up to here


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
    per-sample latency is the host's at every T: on the H200 (commit 7ffb2da, `python -m
    tools.bench_memory_ops --ops timestep_sinusoid`) blocks of [4|2|1, 128] on 2 or 4 warps came within
    the host's 10-15 us jitter of this one at T = 1 and 2048, none measurably faster
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


def _check(t, freq_dim, max_period, shift) -> None:
    checks.tensors({"t": t})
    checks.dtype_in("t", t, _T_DTYPES, "expected a floating dtype (float32 in the model)")
    if t.dim() != 1:
        raise ValueError(f"t must be 1-D [T], got shape {tuple(t.shape)}")
    checks.triton_device("t", t)
    if isinstance(freq_dim, bool) or not isinstance(freq_dim, int) or freq_dim < 2 or freq_dim % 2:
        raise ValueError(f"freq_dim must be an even int >= 2 (half cosines, half sines), got {freq_dim!r}")
    for name, value in (("max_period", max_period), ("downscale_freq_shift", shift)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    # an infinite max_period or shift gives NaN or constant columns (ln(inf) * 0, k / inf): refused
    if not (math.isfinite(max_period) and max_period > 1):
        raise ValueError(f"max_period must be finite and > 1, got {max_period!r}")
    if not (math.isfinite(shift) and shift < freq_dim // 2):
        raise ValueError(f"downscale_freq_shift must be finite and < freq_dim / 2 = {freq_dim // 2}, got {shift!r}")


# (device, freq_dim, max_period, shift, config) -> (frequencies, rows per program, the kernel's constexprs,
# {t dtype: (launch_ready's run, head and tail, the frequencies' address)})
_RECIPES: dict = {}


def timestep_sinusoid(t: torch.Tensor, freq_dim: int = 256, max_period: float = 10000,
                      downscale_freq_shift: float = 0.0, config: Optional[LaunchConfig] = None) -> torch.Tensor:
    """[T, freq_dim] fp32: [cos(t f), sin(t f)] with f_k = exp(-ln(max_period) k / (freq_dim/2 - shift))
    (diffusers' Timesteps(freq_dim, flip_sin_to_cos=True, downscale_freq_shift=shift)). t: [T], any
    float dtype, any stride. No gradient (the op is forward only)."""
    # A call like an earlier checked one (same device and constants, t a 1-D tensor of an allowed dtype)
    # skips the checks that call made; anything else takes the checked path.
    recipe = None
    if isinstance(t, torch.Tensor) and type(freq_dim) is int:
        device = t.device  # read once: each read makes a new torch.device
        recipe = _RECIPES.get((device, freq_dim, max_period, downscale_freq_shift, config))
    if recipe is None or t.dtype not in _T_DTYPES or t.dim() != 1:
        recipe = _checked_recipe(t, freq_dim, max_period, downscale_freq_shift, config)
        device = t.device
    # is_cuda: no string made, as device.type; torch's raw getter: torch.cuda.current_device() adds a Python
    # frame and its lazy-init check (CUDA is initialized once t is a CUDA tensor)
    if t.is_cuda and device.index != _cuda_device():
        with torch.cuda.device(device):  # triton launches on the current device
            return timestep_sinusoid(t, freq_dim, max_period, downscale_freq_shift, config)
    freqs, rows_per_program, meta, direct = recipe
    rows = t.shape[0]
    # the size as two ints, not a tuple: torch's argument parser takes ~0.5 us less (CPU-measured)
    out = t.new_empty(rows, freq_dim, dtype=torch.float32)
    if rows:
        programs, stride = (rows + rows_per_program - 1) // rows_per_program, t.stride(0)
        entry = direct.get(t.dtype)
        if entry is not None and rows <= _I32_MAX and -_I32_MAX <= stride <= _I32_MAX and fast_launch_allowed():
            # launch_ready's own launch, with the pointers as ints (t is on this CUDA device: the recipe's)
            run, head, tail, freqs_ptr = entry
            run(programs, 1, 1, torch._C._cuda_getCurrentRawStream(device.index), *head, t.data_ptr(), freqs_ptr,
                out.data_ptr(), rows, stride, *tail)
        else:
            launch_ready(_sinusoid_kernel, (programs,), device.index, t.dtype, (t, freqs, out, rows, stride), meta)
            if t.is_cuda:
                ready = ready_runner(_sinusoid_kernel, device.index, t.dtype, meta)
                if ready is not None:
                    direct[t.dtype] = (*ready, freqs.data_ptr())
    return out


def _checked_recipe(t, freq_dim, max_period, downscale_freq_shift, config) -> tuple:
    """Every check, then what later calls with this device and these constants reuse: the frequencies,
    the rows per program and the kernel's constexprs."""
    _check(t, freq_dim, max_period, downscale_freq_shift)
    half = freq_dim // 2
    cfg = config or launch_config(freq_dim)
    for name in ("rows", "warps"):  # tl.arange and the warp count take powers of two
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"config.{name} must be a power of two, got {value!r}")
    meta = (("HALF", half), ("BLOCK_K", next_power_of_2(half)), ("ROWS", cfg.rows),
            ("INTERPRETED", INTERPRETED), ("num_warps", cfg.warps))
    # the last item: per t dtype, launch_ready's entry and the frequencies' address, once it has one
    recipe = (frequencies(t.device, half, max_period, downscale_freq_shift), cfg.rows, meta, {})
    _RECIPES[(t.device, freq_dim, max_period, downscale_freq_shift, config)] = recipe
    return recipe
