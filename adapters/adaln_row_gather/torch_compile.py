"""`torch.compile` of the diffusers row's composition, default mode, automatic dynamic shapes
(adapters/_torch_compile.py)."""
from __future__ import annotations

from h3bench.adapters._torch_compile import DEFAULT, compiled_row
from h3bench.adapters.adaln_row_gather.diffusers import ADAPTER as DIFFUSERS

ADAPTER = compiled_row(DIFFUSERS, "torch_compile", DEFAULT)
