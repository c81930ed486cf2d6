"""Operators h3bench knows. A new op is one module here plus one line below, its configs/<op>/ and its
adapters/<op>/ with their line in adapters/__init__.py (docs/operators.md, "Adding an op", lists every step;
the wheel finds the new folders itself). Ops from elsewhere are registered with `register` or, for child processes too, through
H3BENCH_OP_MODULES ("name=module,..."; how the tests add their toy op).

A user's own op is declared with the public names exported here (`UserOp`, `Input`, `Traffic`:
harness/ops/public.py) and reaches the registry through harness/op_source.py (`--op path.py:ATTR`,
`module:ATTR` or the `h3bench.ops` entry-point group), which calls `register_declared`. `--op all` and
OP_MODULES stay the built-in ops.
"""
from __future__ import annotations

import importlib
import os

from h3bench.harness.ops.base import Input, Op, Traffic
from h3bench.harness.ops.public import UserOp

__all__ = ["Input", "Traffic", "UserOp", "Op", "get_op", "known", "register", "register_declared"]

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
# Ops resolved in this process from a user's declaration (harness/op_source.py), by name, and where each
# was declared (the text that resolves it again, in a mode's child process too).
DECLARED: dict[str, Op] = {}
DECLARED_SOURCES: dict[str, str] = {}


def get_op(name: str) -> Op:
    if name in DECLARED:
        return DECLARED[name]
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


def known(name: str) -> bool:
    """Whether `name` is an op of this process: built in, registered by module, or declared."""
    return name in OP_MODULES or name in DECLARED


def register_declared(op: Op, source: str) -> None:
    """Make a declared op findable by name in this process. A built-in op's name is refused; so is a
    second declaration of a name from another source (the same source, resolved again, replaces it)."""
    if op.name in OP_MODULES:
        raise ValueError(f"op {op.name!r} ({source}) has a built-in op's name: name yours otherwise")
    earlier = DECLARED_SOURCES.get(op.name, source)
    if earlier != source:
        raise ValueError(f"op {op.name!r} is declared twice: by {earlier} and by {source}")
    DECLARED[op.name] = op
    DECLARED_SOURCES[op.name] = source


def register(name: str, module: str) -> None:
    if OP_MODULES.get(name, module) != module:
        raise ValueError(f"op {name!r} is registered already, as {OP_MODULES[name]}")
    OP_MODULES[name] = module


for _item in filter(None, (i.strip() for i in os.environ.get(MODULES_VARIABLE, "").split(","))):
    _name, _, _module = _item.partition("=")
    register(_name.strip(), _module.strip())
