"""`torch.compile(mode="max-autotune-no-cudagraphs")` of the torch row's composition, automatic dynamic
shapes, within a compile budget (adapters/_torch_compile.py)."""
from __future__ import annotations

from h3bench.adapters._torch_compile import MAX_AUTOTUNE, compiled_row
from h3bench.adapters.layer_norm.torch import ADAPTER as TORCH

ADAPTER = compiled_row(TORCH, "torch_compile_max_autotune", MAX_AUTOTUNE)
