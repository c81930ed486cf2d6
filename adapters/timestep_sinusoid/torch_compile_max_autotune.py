"""`torch.compile(mode="max-autotune-no-cudagraphs")` of the diffusers row's composition, automatic dynamic
shapes, within a compile budget (adapters/_torch_compile.py)."""
from __future__ import annotations

from h3bench.adapters._torch_compile import MAX_AUTOTUNE, compiled_row
from h3bench.adapters.timestep_sinusoid.diffusers import ADAPTER as DIFFUSERS

ADAPTER = compiled_row(DIFFUSERS, "torch_compile_max_autotune", MAX_AUTOTUNE)
