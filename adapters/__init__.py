"""Built-in adapters: `adapters/<op>/<name>.py`, each defining `ADAPTER`; rows are keyed by (op, name).

Adding an implementation = one new module plus one line in BUILTIN below. Modules import their library
only inside `load`, so listing them here costs nothing. Helpers shared by several ops' rows (importing
SGLang's kernels, rl-kernel's ops) live in `adapters/_*.py`.
"""
from __future__ import annotations

import importlib

from h3bench.harness.adapter import Adapter

BUILTIN: dict[str, tuple[str, ...]] = {
    "norm_modulate": ("diffusers", "torch_rms_norm", "transformer_engine", "liger", "liger_rlk_gather",
                      "liger_det_gather", "sglang", "sglang_indexed", "rl_kernel", "h3bench_triton",
                      "quack_rms_norm", "comfy_kitchen", "comfy_kitchen_triton"),
    "timestep_sinusoid": ("diffusers", "sglang", "rl_kernel", "h3bench_triton"),
    "timestep_mlp": ("diffusers", "rl_kernel", "h3bench_triton"),
    "adaln_projection": ("diffusers", "h3bench_triton"),
    "adaln_row_gather": ("diffusers", "torch_embedding", "rl_kernel", "h3bench_triton"),
    "gate_residual": ("diffusers", "torch_addcmul", "rl_kernel", "h3bench_triton"),
    "final_adaln_out": ("diffusers", "rl_kernel", "h3bench_triton"),
    # the common ops: torch's own function, then the libraries users pick for it
    "rms_norm": ("torch", "liger", "quack", "transformer_engine"),
    "layer_norm": ("torch", "liger", "transformer_engine"),
    "linear": ("torch", "transformer_engine"),
    "softmax": ("torch", "liger", "quack"),
}
# Every op also has the torch.compile rows (adapters/_torch_compile.py): its composition row (the RFC's ops'
# diffusers row, the common ops' torch row: `Op.composition_row`) compiled.
COMPILED = ("torch_compile", "torch_compile_max_autotune")
BUILTIN = {op: rows + COMPILED for op, rows in BUILTIN.items()}


def builtin_adapters(op: str | None = None) -> list[Adapter]:
    """The built-in rows of `op` (all ops when None), in registry order."""
    ops = [op] if op is not None else list(BUILTIN)
    found = []
    for name in ops:
        for row in BUILTIN.get(name, ()):
            adapter = importlib.import_module(f"h3bench.adapters.{name}.{row}").ADAPTER
            if adapter.key != (name, row):
                raise RuntimeError(f"adapters/{name}/{row}.py defines row {adapter.key}, not {(name, row)}")
            found.append(adapter)
    return found


def control_composition(op: str) -> Adapter | None:
    """The row the negative control plants its fault in (harness/control.py): the op's composition row
    (`Op.composition_row`: diffusers' composition for the RFC's ops, the torch call for the common ops), or
    None for an op without one among its built-in rows (a user op: harness/control.py uses its declaration)."""
    from h3bench.harness.ops import get_op

    row = get_op(op).composition_row
    if row not in BUILTIN.get(op, ()):
        return None
    return importlib.import_module(f"h3bench.adapters.{op}.{row}").ADAPTER
