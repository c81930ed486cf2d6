"""Importing the RFC's own CUDA ops (rl-kernel's `rl_engine`), shared by every op's rl-kernel rows, and the
one loader those rows share (`rl_kernel_row`: they differ only in the class, its modules and the call).

rl_engine is not on the package index. The GPU evidence run builds the rl-kernel reassembly
(docs/third_party.md) into a scratch copy (tools/build_rl_kernel.sh), which writes
`H3BENCH_SOURCE` beside the `rl_engine` package naming the reassembly and its upstream commits; that line
goes into the rows' `source` and the file's `rl_kernel_commit` (harness.environment.rl_kernel_commit).
A git checkout of rl-kernel is named by its HEAD instead. The ops have lived in two places (the RFC script's commit, then a later layout); both
are tried.
"""
from __future__ import annotations

import importlib
import sys
from importlib import metadata
from typing import Any, Callable, Optional

import torch

from h3bench.harness.adapter import Adapter, Loaded, OpCallable
from h3bench.harness.environment import rl_kernel_commit
from h3bench.harness.execute import describe_exception

RMSNORM_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.rmsnorm",
    "rl_engine.backends.cuda.model_specific.minimax_h3.rmsnorm",
)
ROW_GATHER_MODULES = (
    "rl_engine.kernels.ops.cuda.h3.adaln_row_gather",
    "rl_engine.backends.cuda.model_specific.minimax_h3.adaln_row_gather",
)


def rl_engine_attr(modules: tuple[str, ...], attr: str):
    """(object, module name) for the first of `modules` that has `attr`; ImportError otherwise."""
    importlib.import_module("rl_engine")  # its own ImportError is the clearest reason
    tried = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            tried.append(f"{name} ({exc})")
            continue
        if hasattr(module, attr):
            return getattr(module, attr), name
        tried.append(f"{name} (no {attr})")
    raise ImportError(f"rl_engine has no {attr}: tried " + "; ".join(tried))


def rl_engine_source() -> str:
    """For source strings: the distribution and version when installed, else the build it came from."""
    for dist in metadata.packages_distributions().get("rl_engine", []):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    built = rl_kernel_commit()
    if built:
        return built
    return f"rl_engine {getattr(sys.modules.get('rl_engine'), '__version__', '(version unknown)')}"


def import_rl_kernel_op(modules: tuple[str, ...], attr: str):
    """(object, module name) of an rl-kernel op; an ImportError naming the op when it is missing."""
    try:
        return rl_engine_attr(modules, attr)
    except ImportError as exc:
        raise ImportError(f"rl-kernel's {attr} is not importable ({describe_exception(exc)})") from exc


def _called_with_inputs(op: Any, params: Any) -> OpCallable:
    """The call of most rl-kernel ops: the op object on the op's inputs, in call order, nothing added."""
    def fn(*inputs):
        return op(*inputs)
    return fn


def rl_kernel_row(op: str, class_name: str, modules: tuple[str, ...], grads: tuple[str, ...], summary: str, *,
                  call: Callable[[Any, Any], OpCallable] = _called_with_inputs, how: str = "",
                  check: Optional[Callable[[Any, Optional[str]], None]] = None,
                  name_the_op_first: bool = False) -> Adapter:
    """The `rl_kernel` row of `op`: rl-kernel's CUDA op class `class_name`, looked for in `modules` (the RFC
    script's layout, then the later one), constructed once per load, and `call(op_object, params)` as the
    row's fn. Every op's rl-kernel row loads the same way; what differs is passed in:

    - `how`: what the source names after the class (the method called, its fixed arguments);
    - `check(params, module)`: refuses constants rl-kernel builds in, just before the device check;
      `module` is where the class was found, or None while it is not imported yet;
    - `name_the_op_first`: import before the device check, with an ImportError naming the op (the ops
      docs/operators.md lists as not public, so a CPU run's reason says that the op is missing, not only that
      CUDA is); otherwise the device is checked first and the import's own error is the reason.
    """
    def load(device: torch.device, params: Any) -> Loaded:
        found = import_rl_kernel_op(modules, class_name) if name_the_op_first else None
        if check is not None:
            check(params, found[1] if found else None)
        if device.type != "cuda":
            raise RuntimeError(f"needs CUDA (rl_engine._C extension), got device {device}")
        op_class, module = found or rl_engine_attr(modules, class_name)
        op_object = op_class()  # raises RuntimeError when rl_engine._C lacks the op's kernels
        return Loaded(fn=call(op_object, params),
                      source=f"rl-kernel {class_name}{how} ({module}, {rl_engine_source()})")

    return Adapter(name="rl_kernel", op=op, grads=grads, load=load, summary=summary)
