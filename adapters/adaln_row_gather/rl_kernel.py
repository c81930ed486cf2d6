"""The RFC's own CUDA op: `H3AdaLNRowGatherCudaOp()(table, ti, tag)` returns the six `[S, H]` chunks of
`table[ti * 3 + tag]`, with a fixed-order (sorted, fp32 segmented) backward instead of atomics.

rl_engine is not on the package index; the row is unavailable unless `import rl_engine` works
(adapters/_rl_engine.py says how the evidence run builds it). rl-kernel hard-codes the layout
(`H3_MODALITY_NUM = 3`, `H3_ADALN_CHUNKS = 6`), so the row refuses any other `modalities` or `chunks`.
"""
from __future__ import annotations

from typing import Optional

from h3bench.adapters._rl_engine import ROW_GATHER_MODULES, rl_kernel_row
from h3bench.harness.ops.adaln_row_gather import AdaLNRowGatherParams

RL_KERNEL_MODALITIES = 3  # H3_MODALITY_NUM
RL_KERNEL_CHUNKS = 6      # H3_ADALN_CHUNKS


def _built_in_layout(params: AdaLNRowGatherParams, module: Optional[str]) -> None:
    if params.modalities != RL_KERNEL_MODALITIES or params.chunks != RL_KERNEL_CHUNKS:
        raise ValueError(f"rl-kernel's row gather has {RL_KERNEL_MODALITIES} modalities and {RL_KERNEL_CHUNKS} "
                         f"chunks built in; this run has modalities = {params.modalities}, "
                         f"chunks = {params.chunks}")


ADAPTER = rl_kernel_row("adaln_row_gather", "H3AdaLNRowGatherCudaOp", ROW_GATHER_MODULES, grads=("table",),
                        check=_built_in_layout, summary="the RFC's CUDA op H3AdaLNRowGatherCudaOp (rl_engine)")
