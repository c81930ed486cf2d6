"""`torch.compile` of the torch row's composition, default mode, automatic dynamic shapes
(adapters/_torch_compile.py)."""
from __future__ import annotations

from h3bench.adapters._torch_compile import DEFAULT, compiled_row
from h3bench.adapters.linear.torch import ADAPTER as TORCH

ADAPTER = compiled_row(TORCH, "torch_compile", DEFAULT)
