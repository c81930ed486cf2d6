"""The RFC's own CUDA op: `H3AdaLNRowGatherCudaOp()(table, ti, tag)` returns the six `[S, H]` chunks of
`table[ti * 3 + tag]`, with a fixed-order (sorted, fp32 segmented) backward instead of atomics.

rl_engine is not on the package index; the row is unavailable unless `import rl_engine` works
(adapters/_rl_engine.py says how the evidence run builds it). rl-kernel hard-codes the layout
(`H3_MODALITY_NUM = 3`, `H3_ADALN_CHUNKS = 6`), so the row refuses any other `modalities` or `chunks`.
"""
from __future__ import annotations

import torch

from adapters._rl_engine import ROW_GATHER_MODULES, rl_engine_attr, rl_engine_source
from harness.adapter import Adapter, Loaded
from harness.ops.adaln_row_gather import AdaLNRowGatherParams

RL_KERNEL_MODALITIES = 3  # H3_MODALITY_NUM
RL_KERNEL_CHUNKS = 6      # H3_ADALN_CHUNKS


def _load(device: torch.device, params: AdaLNRowGatherParams) -> Loaded:
    if params.modalities != RL_KERNEL_MODALITIES or params.chunks != RL_KERNEL_CHUNKS:
        raise ValueError(f"rl-kernel's row gather has {RL_KERNEL_MODALITIES} modalities and {RL_KERNEL_CHUNKS} "
                         f"chunks built in; this run has modalities = {params.modalities}, "
                         f"chunks = {params.chunks}")
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (rl_engine._C extension), got device {device}")
    op_class, module = rl_engine_attr(ROW_GATHER_MODULES, "H3AdaLNRowGatherCudaOp")
    op = op_class()  # raises RuntimeError when rl_engine._C lacks the kernels

    def fn(table, ti, tag):
        return op(table, ti, tag)

    return Loaded(fn=fn, source=f"rl-kernel H3AdaLNRowGatherCudaOp ({module}, {rl_engine_source()})")


ADAPTER = Adapter(name="rl_kernel", op="adaln_row_gather", grads=("table",), load=_load,
                  summary="the RFC's CUDA op H3AdaLNRowGatherCudaOp (rl_engine)")
