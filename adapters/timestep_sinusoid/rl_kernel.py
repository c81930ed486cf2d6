"""The RFC's own CUDA op: `H3TimestepSinusoidCudaOp().forward(t, num_channels=..., check_range=False)`.

docs/operators.md (timestep_sinusoid) lists it as not public. Public RL-Align/RL-Kernel files do define it (the two module paths
below: the RFC script's layout, then the later one; the call is the RFC
script's), but the rl-kernel reassembly h3bench builds (docs/third_party.md) has neither the
module nor `csrc/cuda/h3/timestep_sinusoid.cu`: there the row is unavailable, and its reason names the
class and every module tried. The class refuses to construct
when `rl_engine._C` lacks `h3_timestep_sinusoid_forward`, and rl-kernel builds in the model's constants
(max_period 10000, shift 0), so other constants are refused here.
"""
from __future__ import annotations

import importlib
from typing import Optional

from h3bench.adapters._rl_engine import rl_kernel_row
from h3bench.harness.ops.timestep_sinusoid import TimestepSinusoidParams

SINUSOID_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.timestep_sinusoid",
    "rl_engine.backends.cuda.model_specific.minimax_h3.timestep_sinusoid",
)
CLASS = "H3TimestepSinusoidCudaOp"
RL_KERNEL_MAX_PERIOD = 10000   # H3_MAX_PERIOD, read from the op's module when it has it
RL_KERNEL_SHIFT = 0.0          # rl-kernel's frequencies divide by num_channels / 2 (no shift argument)


def _built_in_constants(params: TimestepSinusoidParams, module: Optional[str]) -> None:
    # module is never None here: the row imports the op before its checks (name_the_op_first)
    max_period = getattr(importlib.import_module(module), "H3_MAX_PERIOD", RL_KERNEL_MAX_PERIOD)
    if (params.max_period, params.downscale_freq_shift) != (max_period, RL_KERNEL_SHIFT):
        raise ValueError(f"rl-kernel's {CLASS} has max_period {max_period} and shift {RL_KERNEL_SHIFT} built in; "
                         f"this run has max_period {params.max_period}, shift {params.downscale_freq_shift}")


def _call(op, params: TimestepSinusoidParams):
    channels = params.freq_dim

    def fn(t):
        # t is drawn in [0, 1): the range check (a host sync per call) is off, as in the RFC's script
        return op.forward(t, num_channels=channels, check_range=False)

    return fn


ADAPTER = rl_kernel_row("timestep_sinusoid", CLASS, SINUSOID_MODULES, grads=(), call=_call,
                        how=".forward, check_range=False", check=_built_in_constants, name_the_op_first=True,
                        summary="the RFC's CUDA op H3TimestepSinusoidCudaOp (rl_engine; not in h3bench's rl-kernel "
                                "build)")
