"""`timestep_sinusoid(t, freq_dim, max_period, downscale_freq_shift)`: argument checks and the launch path of
kernels/timestep_sinusoid_kernel.py's kernel, and the custom op torch.compile captures (kernels/custom_ops.py).

Why the path is short: float64 costs the kernel little (2 x 128 sin/cos a row, ~1 us of arithmetic at
T = 2048 on an H200), so at every T a call's cost is the host path (kernels/notes/timestep_sinusoid.md,
"host path", has the figures and `python -m tools.hostcost --sinusoid-only`, which measures them). After
the first call per (device, constants) a call is: one dictionary lookup, the dtype and rank of t, one
allocation and `kernels.common.launch_ready` (no binder: the kernel's compiled code depends on t's dtype
alone: its integers are not specialized, t's pointer not on alignment, and the frequencies and the output
are our own fresh allocations). From the second call per t dtype, the entry `launch_ready` made is kept in
the recipe and called with the three pointers as ints (`kernels.common.ready_runner`): no lookup by the
constexprs, no data_ptr() calls and pointer checks in the C launcher (t is on the recipe's CUDA device, the
other two are ours).
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch
from torch import Tensor

from h3bench.kernels import checks
from h3bench.kernels import timestep_sinusoid_kernel as K
from h3bench.kernels.common import INTERPRETED, fast_launch_allowed, launch_ready, next_power_of_2, ready_runner
from h3bench.kernels.custom_ops import compiling, config_fields, config_of

_T_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_cuda_device = getattr(torch._C, "_cuda_getDevice", None)  # absent from a CPU-only torch (t.is_cuda never true)
_I32_MAX = (1 << 31) - 1  # the kernel's ints are int32 (not specialized on their value) up to here


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
                      downscale_freq_shift: float = 0.0, config: Optional[K.LaunchConfig] = None) -> torch.Tensor:
    """[T, freq_dim] fp32: [cos(t f), sin(t f)] with f_k = exp(-ln(max_period) k / (freq_dim/2 - shift))
    (diffusers' Timesteps(freq_dim, flip_sin_to_cos=True, downscale_freq_shift=shift)). t: [T], any
    float dtype, any stride. No gradient (the op is forward only)."""
    if compiling():  # torch.compile captures the custom op (below)
        return _traced(t, freq_dim, max_period, downscale_freq_shift, config)
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
    # the size as two ints, not a tuple: torch's argument parser takes them faster (tools/hostcost_cpu.py)
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
            launch_ready(K._sinusoid_kernel, (programs,), device.index, t.dtype, (t, freqs, out, rows, stride), meta)
            if t.is_cuda:
                ready = ready_runner(K._sinusoid_kernel, device.index, t.dtype, meta)
                if ready is not None:
                    direct[t.dtype] = (*ready, freqs.data_ptr())
    return out


def _checked_recipe(t, freq_dim, max_period, downscale_freq_shift, config) -> tuple:
    """Every check, then what later calls with this device and these constants reuse: the frequencies,
    the rows per program and the kernel's constexprs."""
    _check(t, freq_dim, max_period, downscale_freq_shift)
    half = freq_dim // 2
    cfg = config or K.launch_config(freq_dim)
    for name in ("rows", "warps"):  # tl.arange and the warp count take powers of two
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"config.{name} must be a power of two, got {value!r}")
    meta = (("HALF", half), ("BLOCK_K", next_power_of_2(half)), ("ROWS", cfg.rows),
            ("INTERPRETED", INTERPRETED), ("num_warps", cfg.warps))
    # the last item: per t dtype, launch_ready's entry and the frequencies' address, once it has one
    recipe = (K.frequencies(t.device, half, max_period, downscale_freq_shift), cfg.rows, meta, {})
    _RECIPES[(t.device, freq_dim, max_period, downscale_freq_shift, config)] = recipe
    return recipe


# --- the custom op torch.compile captures (kernels/custom_ops.py) -----------------------------------------

def _traced(t: Tensor, freq_dim: int = 256, max_period: float = 10000, downscale_freq_shift: float = 0.0,
            config: Optional[K.LaunchConfig] = None) -> Tensor:
    """The call as a traced graph holds it: the op, on t detached (no gradient, as the eager call)."""
    return _op(t.detach(), freq_dim, max_period, downscale_freq_shift, config_fields(config))


@torch.library.custom_op("h3bench::timestep_sinusoid", mutates_args=())
def _op(t: Tensor, freq_dim: int, max_period: float, downscale_freq_shift: float, config: list[int]) -> Tensor:
    """The eager call; config: `config_fields`."""
    return timestep_sinusoid(t, freq_dim, max_period, downscale_freq_shift, config_of(K.LaunchConfig, config))


@_op.register_fake
def _fake(t, freq_dim, max_period, downscale_freq_shift, config):
    _check(t, freq_dim, max_period, downscale_freq_shift)
    return t.new_empty(t.shape[0], freq_dim, dtype=torch.float32)
