"""SGLang's diffusion `timestep_embedding` (forward only; CUDA JIT kernel).

`sglang.kernels.ops.diffusion.modulate.timestep_embedding_jit.timestep_embedding(t, dim, flip_sin_to_cos,
downscale_freq_shift, scale=1, max_period=10000, dtype=torch.float32)` returns a [T, dim] fp32 tensor. Its
kernel (`sglang/kernels/jit/csrc/diffusion/timestep_embedding.cuh`) computes one row per element of t,
`angle = scale * t * expf(-ln(max_period) / (half_dim - shift) * i)` with `cosf`/`sinf`, `[cos | sin]` when
flip_sin_to_cos; it needs `dim % 8 == 0`, a 1-D contiguous CUDA t. SGLang compiles it with its own JIT
(nvcc + ninja + apache-tvm-ffi) at the first call, so `load` makes one call: a toolchain that cannot build
it makes the row unavailable with the build's error instead of failing inside a probe.
"""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded, installed_version
from h3bench.harness.ops.timestep_sinusoid import TimestepSinusoidParams

MODULE = "sglang.kernels.ops.diffusion.modulate.timestep_embedding_jit"
DIM_MULTIPLE = 8  # the kernel's `dim % 8 == 0`


def _load(device: torch.device, params: TimestepSinusoidParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (SGLang's JIT-compiled CUDA kernel), got device {device}")
    dim, shift, max_period = params.freq_dim, float(params.downscale_freq_shift), params.max_period
    if dim % DIM_MULTIPLE:
        raise ValueError(f"SGLang's timestep_embedding needs freq_dim % {DIM_MULTIPLE} == 0, got {dim}")
    from h3bench.adapters._sglang_import import import_sglang_module

    timestep_embedding = import_sglang_module(MODULE).timestep_embedding

    def fn(t):
        return timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=shift, max_period=max_period)

    fn(torch.zeros(1, dtype=torch.float32, device=device))  # JIT build and load, outside the probes
    torch.cuda.synchronize(device)
    return Loaded(fn=fn, source=(f"SGLang {installed_version('sglang')} timestep_embedding (forward only; "
                                 f"CUDA kernel built by SGLang's JIT, flip_sin_to_cos=True, "
                                 f"apache-tvm-ffi {installed_version('apache-tvm-ffi')})"))


ADAPTER = Adapter(name="sglang", op="timestep_sinusoid", grads=(), load=_load,
                  summary="SGLang diffusion timestep_embedding (JIT CUDA kernel)")
