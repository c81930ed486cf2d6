"""Importing the RFC's own CUDA ops (rl-kernel's `rl_engine`), shared by every op's rl-kernel rows.

rl_engine is not on the package index. The GPU evidence run builds the reassembly in
`shared/third_party/rl-kernel-h3` into a scratch copy (tools/build_rl_kernel.sh), which writes
`H3BENCH_SOURCE` beside the `rl_engine` package naming the reassembly and its upstream commits; that line
goes into the rows' `source` and the file's `rl_kernel_commit` (harness.environment.rl_kernel_commit).
A git checkout of rl-kernel is named by its HEAD instead. The ops have lived in two places (the RFC script's commit, then a later layout); both
are tried.
"""
from __future__ import annotations

import importlib
import sys
from importlib import metadata

from harness.environment import rl_kernel_commit

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
