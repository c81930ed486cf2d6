"""`F.embedding` on the table, then `chunk(6, dim=1)`: what a user would pick instead of index_select.

Its forward is the same copy; its backward is `embedding_dense_backward`, which on CUDA sorts the indices and
sums each table row's gradients in segments (no index_add atomics), and on the CPU accumulates serially.
The outputs are strided views of the one gathered `[S, 6H]` tensor.
"""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.adaln_row_gather import AdaLNRowGatherParams


def _load(device: torch.device, params: AdaLNRowGatherParams) -> Loaded:
    modalities, chunks = params.modalities, params.chunks
    import torch.nn.functional as F

    def embedding(table, ti, tag):
        return F.embedding(ti * modalities + tag, table).chunk(chunks, dim=1)

    return Loaded(fn=embedding, source=f"torch {torch.__version__} F.embedding(ti * {modalities} + tag, table)"
                                       f".chunk({chunks}, dim=1)")


ADAPTER = Adapter(name="torch_embedding", op="adaln_row_gather", grads=("table",), load=_load,
                  summary="F.embedding then chunk (sort-based embedding_dense_backward on CUDA)")
