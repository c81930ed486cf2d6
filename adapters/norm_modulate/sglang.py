"""SGLang's CuTe DSL `fused_norm_scale_shift` on rows pre-gathered with index_select (forward only).

The kernel takes per-token scale/shift broadcastable to x's [B, S, D], so the table rows are
gathered first and everything gets a leading batch dimension of 1, as in the RFC's script.
Note its argument order: scale before shift.
"""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded, installed_version
from h3bench.harness.ops.norm_modulate import NormModulateParams

MODULE = "sglang.kernels.ops.diffusion.norm.scale_residual_norm_cutedsl"
# fused_norm_scale_shift imports this on every call (a Blackwell-only LayerNorm fast path that
# declines RMSNorm); importing it here keeps that import out of the timed calls.
CALL_TIME_MODULE = "sglang.kernels.kda_kernels.norm_scale_shift_jit"


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    eps = params.eps
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (CuTe DSL kernel), got device {device}")
    from h3bench.adapters._sglang_import import ensure_cutlass_dsl_on_path, import_sglang_module

    ensure_cutlass_dsl_on_path()
    fused_norm_scale_shift = import_sglang_module(MODULE).fused_norm_scale_shift
    import_sglang_module(CALL_TIME_MODULE)

    def fn(x, w, sh, sc, idx):
        scale, shift = sc.index_select(0, idx), sh.index_select(0, idx)
        return fused_norm_scale_shift(x[None], w, None, scale[None], shift[None], "rms", eps)[0]

    return Loaded(fn=fn, source=(
        f"SGLang {installed_version('sglang')} fused_norm_scale_shift (forward only; CuTe DSL, "
        f"nvidia-cutlass-dsl {installed_version('nvidia-cutlass-dsl-libs-base')}; rows pre-gathered with "
        f"index_select)"))


ADAPTER = Adapter(name="sglang", op="norm_modulate", grads=(), load=_load,
                  summary="SGLang CuTe DSL fused_norm_scale_shift on index_select-gathered rows")
