"""The RFC's own CUDA op: `H3TimestepMLPCudaOp()(x, w1, b1, w2, b2)` (plain mode only, per docs/operators.md, timestep_mlp).

docs/operators.md (timestep_mlp) lists it as not public. Public RL-Align/RL-Kernel files do define it (the two module paths
below: the RFC script's layout, then the later one; the call is the RFC script's): two batch-invariant
"h3-det-linear-v1" GEMVs from `rl_engine._C.h3_det_linear_*`, SiLU fused into the first, with a
deterministic backward for all five inputs. The rl-kernel reassembly h3bench builds
(docs/third_party.md) has neither the module nor `csrc/cuda/h3/det_linear.cu`: there the row
is unavailable, and its reason names the class and every module tried. The class refuses to construct
when `rl_engine._C` lacks the det_linear symbols.

The RFC's script adds this row in plain mode only (its GEMVs are rl-kernel's own, not the aten GEMMs a
global mode replaces); an adapter has no say in which modes run, so run it with `--mode plain`.
"""
from __future__ import annotations

from h3bench.adapters._rl_engine import rl_kernel_row

MLP_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.timestep_mlp",
    "rl_engine.backends.cuda.model_specific.minimax_h3.timestep_mlp",
)
CLASS = "H3TimestepMLPCudaOp"

ADAPTER = rl_kernel_row("timestep_mlp", CLASS, MLP_MODULES, grads=("x", "w1", "b1", "w2", "b2"),
                        name_the_op_first=True,
                        summary="the RFC's CUDA op H3TimestepMLPCudaOp (rl_engine; plain mode only; not in h3bench's "
                                "build)")
