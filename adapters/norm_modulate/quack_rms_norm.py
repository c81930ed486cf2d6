"""Quack's `rmsnorm` (Dao-AILab's CuTe DSL kernels, quack-kernels): the norm without modulation, forward
and backward through its autograd Function, gradients for x and w (as torch_rms_norm)."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded, installed_version
from h3bench.harness.ops.norm_modulate import NormModulateParams


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    eps = params.eps
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (CuTe DSL kernel), got device {device}")
    from h3bench.adapters._sglang_import import ensure_cutlass_dsl_on_path

    ensure_cutlass_dsl_on_path()
    from quack import rmsnorm

    def norm_only(x, w, sh, sc, idx):
        return rmsnorm(x, w, eps=eps)

    return Loaded(fn=norm_only, source=(
        f"Quack {installed_version('quack-kernels')} rmsnorm (no modulation; CuTe DSL, nvidia-cutlass-dsl "
        f"{installed_version('nvidia-cutlass-dsl-libs-base')}; autograd forward and backward)"))


ADAPTER = Adapter(name="quack_rms_norm", op="norm_modulate", grads=("x", "w"), load=_load,
                  summary="Quack CuTe DSL rmsnorm alone", reference="rms_norm")
