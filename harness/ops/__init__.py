"""Operators h3bench knows. A new op is one module here plus one line below (and its configs/<op>/ and
adapters/<op>/). Ops from elsewhere are registered with `register` or, for child processes too, through
H3BENCH_OP_MODULES ("name=module,..."; how the tests add their toy op)."""
from __future__ import annotations

import importlib
import os

from h3bench.harness.ops.base import Op

OP_MODULES: dict[str, str] = {
    "norm_modulate": "h3bench.harness.ops.norm_modulate",
    "timestep_sinusoid": "h3bench.harness.ops.timestep_sinusoid",
    "timestep_mlp": "h3bench.harness.ops.timestep_mlp",
    "adaln_projection": "h3bench.harness.ops.adaln_projection",
    "adaln_row_gather": "h3bench.harness.ops.adaln_row_gather",
    "gate_residual": "h3bench.harness.ops.gate_residual",
    "final_adaln_out": "h3bench.harness.ops.final_adaln_out",
}
MODULES_VARIABLE = "H3BENCH_OP_MODULES"


def get_op(name: str) -> Op:
    try:
        module = OP_MODULES[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; known ops: {', '.join(OP_MODULES)}") from None
    op = importlib.import_module(module).OP
    if op.name != name:
        raise RuntimeError(f"{module} defines op {op.name!r}, registered as {name!r}")
    return op


def register(name: str, module: str) -> None:
    if OP_MODULES.get(name, module) != module:
        raise ValueError(f"op {name!r} is registered already, as {OP_MODULES[name]}")
    OP_MODULES[name] = module


for _item in filter(None, (i.strip() for i in os.environ.get(MODULES_VARIABLE, "").split(","))):
    _name, _, _module = _item.partition("=")
    register(_name.strip(), _module.strip())
