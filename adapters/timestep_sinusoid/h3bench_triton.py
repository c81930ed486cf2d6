"""h3bench's own Triton timestep_sinusoid (kernels/timestep_sinusoid_kernel.py): one launch, float64 angle and
cos/sin, one fp32 rounding per output."""
from __future__ import annotations

from importlib import metadata

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.timestep_sinusoid import TimestepSinusoidParams


def _load(device: torch.device, params: TimestepSinusoidParams) -> Loaded:
    from h3bench.kernels.common import interpreter_active, require_triton_device
    from h3bench.kernels.timestep_sinusoid_api import timestep_sinusoid

    require_triton_device(device)
    dim, period, shift = params.freq_dim, params.max_period, params.downscale_freq_shift

    def sinusoid(t):
        return timestep_sinusoid(t, dim, period, shift)

    # One call outside the probes: the frequency table for this device and the compiled kernel.
    sinusoid(torch.zeros(1, dtype=torch.float32, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)

    where = "Triton interpreter" if interpreter_active() else "CUDA"
    return Loaded(fn=sinusoid, source=f"h3bench Triton timestep_sinusoid (triton {metadata.version('triton')}, "
                                      f"{where}; float64 angle and cos/sin, one fp32 rounding)")


ADAPTER = Adapter(name="h3bench_triton", op="timestep_sinusoid", grads=(), load=_load,
                  summary="h3bench's one-launch Triton sinusoid (float64 inside)")
