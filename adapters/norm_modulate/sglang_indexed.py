"""SGLang's Triton `rmsnorm_indexed_scale_shift`: the MiniMax-H3 form that indexes the tables itself.

Forward only. Note its argument order: shift before scale (the opposite of fused_norm_scale_shift).
The kernel reads x rows at `row * H` and both tables with scale's row stride, so x must be
contiguous and the two tables must share a layout (the chunk views of one [M, 6H] table do).
"""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded, installed_version
from h3bench.harness.ops.norm_modulate import NormModulateParams

MODULE = "sglang.kernels.ops.diffusion.norm.rmsnorm_scale_shift_triton"


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    eps = params.eps
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (Triton kernel), got device {device}")
    from h3bench.adapters._sglang_import import import_sglang_module

    rmsnorm_indexed_scale_shift = import_sglang_module(MODULE).rmsnorm_indexed_scale_shift

    def fn(x, w, sh, sc, idx):
        if sh.stride() != sc.stride():
            sh, sc = sh.contiguous(), sc.contiguous()
        return rmsnorm_indexed_scale_shift(x.contiguous(), w, sh, sc, idx, eps)

    return Loaded(fn=fn, source=(
        f"SGLang {installed_version('sglang')} rmsnorm_indexed_scale_shift (forward only; Triton, "
        f"gathers table rows by idx in the kernel)"))


ADAPTER = Adapter(name="sglang_indexed", op="norm_modulate", grads=(), load=_load,
                  summary="SGLang Triton rmsnorm_indexed_scale_shift, tables indexed in the kernel")
