"""Built-in adapters: one module per implementation, each defining `ADAPTER`.

Adding an implementation = one new module here plus one line in BUILTIN_MODULES.
Modules import their library only inside `load`, so listing them here costs nothing.
"""
from __future__ import annotations

import importlib

from harness.adapter import Adapter

BUILTIN_MODULES: tuple[str, ...] = (
    "adapters.diffusers_composition",
    "adapters.torch_rms_norm",
    "adapters.transformer_engine",
    "adapters.liger",
    "adapters.liger_rlk_gather",
    "adapters.liger_det_gather",
    "adapters.sglang",
    "adapters.sglang_indexed",
    "adapters.rl_kernel",
    "adapters.h3bench_triton",
)


def builtin_adapters() -> list[Adapter]:
    return [importlib.import_module(name).ADAPTER for name in BUILTIN_MODULES]
