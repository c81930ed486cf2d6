"""h3bench's own Triton timestep MLP (kernels/timestep_mlp_kernel.py): fp32 GEMMs (GEMM1 in float64; GEMM2, dz1 and
dW2 as three fp16 tensor-core products of power-of-two scaled operands; dx and dW1 tf32x3; small-T weight
gradients IEEE FMA chains), batch-invariant, deterministic weight gradients, bias and silu fused into the
GEMM epilogues."""
from __future__ import annotations

from importlib import metadata

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.timestep_mlp import TimestepMLPParams


def _load(device: torch.device, params: TimestepMLPParams) -> Loaded:
    from h3bench.kernels.common import interpreter_active, require_triton_device
    from h3bench.kernels.timestep_mlp_api import timestep_mlp
    from h3bench.kernels.timestep_mlp_kernel import GRAPHS

    require_triton_device(device)
    where = "Triton interpreter" if interpreter_active() else "CUDA"
    graphs = GRAPHS.described(device)
    return Loaded(fn=timestep_mlp, source=f"h3bench Triton timestep_mlp (triton {metadata.version('triton')}, "
                                          f"{where}; fp32 GEMMs: GEMM1 float64, fp16x3 and tf32x3 tensor cores, IEEE FMA "
                                          f"chains, fixed tile orders{graphs})")


ADAPTER = Adapter(name="h3bench_triton", op="timestep_mlp", grads=("x", "w1", "b1", "w2", "b2"), load=_load,
                  summary="h3bench's batch-invariant Triton GEMMs (fp32 via fp64, fp16x3, tf32x3 and FMA, fused "
                          "bias/silu epilogues)")
