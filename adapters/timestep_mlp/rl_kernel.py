"""The RFC's own CUDA op: `H3TimestepMLPCudaOp()(x, w1, b1, w2, b2)` (plain mode only, per OPERATORS.md).

OPERATORS.md lists it as not public. Public RL-Align/RL-Kernel files do define it (the two module paths
below: the RFC script's layout, then the later one; the call is the RFC script's): two batch-invariant
"h3-det-linear-v1" GEMVs from `rl_engine._C.h3_det_linear_*`, SiLU fused into the first, with a
deterministic backward for all five inputs. The rl-kernel reassembly h3bench builds
(shared/third_party/rl-kernel-h3) has neither the module nor `csrc/cuda/h3/det_linear.cu`: there the row
is unavailable, and its reason names the class and every module tried. The class refuses to construct
when `rl_engine._C` lacks the det_linear symbols.

The RFC's script adds this row in plain mode only (its GEMVs are rl-kernel's own, not the aten GEMMs a
global mode replaces); an adapter has no say in which modes run, so run it with `--mode plain`.
"""
from __future__ import annotations

import torch

from adapters._rl_engine import rl_engine_source
from adapters.timestep_sinusoid.rl_kernel import import_rl_kernel_op
from harness.adapter import Adapter, Loaded
from harness.ops.timestep_mlp import TimestepMLPParams

MLP_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.timestep_mlp",
    "rl_engine.backends.cuda.model_specific.minimax_h3.timestep_mlp",
)
CLASS = "H3TimestepMLPCudaOp"


def _load(device: torch.device, params: TimestepMLPParams) -> Loaded:
    op_class, module = import_rl_kernel_op(MLP_MODULES, CLASS)
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (rl_engine._C extension), got device {device}")
    op = op_class()  # raises RuntimeError when rl_engine._C lacks the h3_det_linear_* kernels

    def fn(x, w1, b1, w2, b2):
        return op(x, w1, b1, w2, b2)

    return Loaded(fn=fn, source=f"rl-kernel {CLASS} ({module}, {rl_engine_source()})")


ADAPTER = Adapter(name="rl_kernel", op="timestep_mlp", grads=("x", "w1", "b1", "w2", "b2"), load=_load,
                  summary="the RFC's CUDA op H3TimestepMLPCudaOp (rl_engine; plain mode only; not in h3bench's build)")
