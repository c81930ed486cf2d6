"""The Liger kernel of the `liger` row, with rows from rl-kernel's deterministic row gather.

This separates Liger from the gather: `H3AdaLNRowGatherCudaOp()(table, timestep_idx, tags)` takes a
[M, 6H] AdaLN table (row = timestep * 3 + tag), returns its six [R, H] chunks gathered per row,
and replaces index_select's atomic scatter-add backward with a sorted, fixed-order sum. As in
the RFC's script, sh and sc become chunks 0 and 1 of a table padded with zeros. rl-kernel fixes the
layout at three modalities (`H3_MODALITY_NUM`), so the row refuses any other `modalities`.
"""
from __future__ import annotations

import torch

from h3bench.adapters.norm_modulate.liger import liger_modulated, liger_version, load_liger_function
from h3bench.adapters._rl_engine import ROW_GATHER_MODULES, rl_engine_attr, rl_engine_source
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.norm_modulate import NormModulateParams

RL_KERNEL_MODALITIES = 3  # H3_MODALITY_NUM: rl-kernel's table rows are timestep * 3 + modality tag


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    eps, modalities = params.eps, params.modalities
    if modalities != RL_KERNEL_MODALITIES:
        raise ValueError(f"rl-kernel's row gather has {RL_KERNEL_MODALITIES} modalities built in; "
                         f"this run has modalities = {modalities}")
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (Triton kernel, rl_engine._C extension), got device {device}")
    function = load_liger_function()
    gather_class, module = rl_engine_attr(ROW_GATHER_MODULES, "H3AdaLNRowGatherCudaOp")
    gather = gather_class()  # raises RuntimeError when rl_engine._C lacks the kernels

    def fn(x, w, sh, sc, idx):
        pad = torch.zeros_like(sh)
        table = torch.cat([sh, sc, pad, pad, pad, pad], dim=1)
        rows = gather(table, torch.div(idx, modalities, rounding_mode="floor"), idx % modalities)
        return liger_modulated(function, x, w, rows[0], rows[1], eps)

    return Loaded(fn=fn, source=(f"Liger {liger_version()} modulated RMSNorm + rl-kernel row gather "
                                 f"(H3AdaLNRowGatherCudaOp from {module}, {rl_engine_source()})"))


ADAPTER = Adapter(name="liger_rlk_gather", op="norm_modulate", grads=("x", "w", "sh", "sc"),
                  load=_load, summary="Liger modulated RMSNorm on rows from rl-kernel's row gather")
