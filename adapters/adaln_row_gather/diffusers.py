"""The row gather diffusers' MiniMax-H3 runs, replayed op for op (diffusers 0.42.1).

`MiniMaxH3AdaLayerNormModulation.forward` returns `temb.view(-1, 6 * hidden_size).chunk(6, dim=-1)` (six
strided `[T*M, H]` views of the table) and `MiniMaxH3TransformerBlock.forward` picks each one's rows with its
own `index_select(0, adaln_indices)` (`scale_msa.index_select(0, adaln_indices)`, ...), where the model
computed `adaln_indices = timestep_indices * MINIMAX_H3_MODALITY_NUM + token_tags` once. So: six
`index_select`s on the chunk views, not one on the table; the forward is a copy either way, and the
backward is six `index_add`s (atomic scatter-adds on CUDA) into the table gradient's chunks.
"""
from __future__ import annotations

import torch

from h3bench.adapters._diffusers import diffusers_installed
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.adaln_row_gather import AdaLNRowGatherParams


def _load(device: torch.device, params: AdaLNRowGatherParams) -> Loaded:
    modalities, chunks = params.modalities, params.chunks

    def composition(table, ti, tag):
        adaln_indices = ti * modalities + tag
        return tuple(chunk.index_select(0, adaln_indices) for chunk in table.chunk(chunks, dim=-1))

    return Loaded(fn=composition,
                  source=("diffusers MiniMax-H3 composition replayed (table.chunk(6, dim=-1), then "
                          f"index_select per chunk){diffusers_installed()}"))


ADAPTER = Adapter(name="diffusers", op="adaln_row_gather", grads=("table",), load=_load,
                  summary="chunk(6) then index_select per chunk, as diffusers' MiniMaxH3TransformerBlock")
