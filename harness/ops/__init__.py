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
    # common ops of any LLM or DiT, audited at a current model's shapes (no kernels of ours)
    "rms_norm": "h3bench.harness.ops.rms_norm",
    "layer_norm": "h3bench.harness.ops.layer_norm",
    "linear": "h3bench.harness.ops.linear",
    "softmax": "h3bench.harness.ops.softmax",
}
# `--op all` is the RFC's suite: every registered op but these. Its files are the ones the committed
# baselines, the nightly job and the RFC's B200 files cover; the common ops are named (`--op linear,...`).
COMMON_OPS = ("rms_norm", "layer_norm", "linear", "softmax")
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


def all_ops() -> list[str]:
    """The ops `--op all` runs, in registry order: every registered op but the common ops."""
    return [name for name in OP_MODULES if name not in COMMON_OPS]


def register(name: str, module: str) -> None:
    if OP_MODULES.get(name, module) != module:
        raise ValueError(f"op {name!r} is registered already, as {OP_MODULES[name]}")
    OP_MODULES[name] = module


for _item in filter(None, (i.strip() for i in os.environ.get(MODULES_VARIABLE, "").split(","))):
    _name, _, _module = _item.partition("=")
    register(_name.strip(), _module.strip())
