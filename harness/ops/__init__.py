"""Operators h3bench knows. A new op is one module here plus one line below."""
from __future__ import annotations

import importlib

from harness.ops.base import Op

OP_MODULES: dict[str, str] = {
    "norm_modulate": "harness.ops.norm_modulate",
}


def get_op(name: str) -> Op:
    try:
        module = OP_MODULES[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; known ops: {', '.join(sorted(OP_MODULES))}") from None
    return importlib.import_module(module).OP
