"""Shared by every op's transformer_engine row: importing TE's PyTorch API without its JAX bindings, its
version for source strings, and running a TE module on the op's own parameters."""
from __future__ import annotations

import sys
from typing import Callable

import torch

from h3bench.harness.adapter import installed_version


def import_te_pytorch():
    # transformer_engine/__init__.py also imports its JAX bindings whenever `jax` is importable
    # (the GPU image has it): blocking that submodule makes TE skip it (it catches ImportError).
    blocked = "transformer_engine" not in sys.modules and "transformer_engine.jax" not in sys.modules
    if blocked:
        sys.modules["transformer_engine.jax"] = None
    try:
        import transformer_engine.pytorch as te
    finally:
        if blocked and sys.modules.get("transformer_engine.jax", 0) is None:
            del sys.modules["transformer_engine.jax"]
    return te


def te_version() -> str:
    return installed_version("transformer_engine")


def with_parameters(make: Callable[[torch.Tensor], torch.nn.Module], names: tuple[str, ...]):
    """A call `(x, *params) -> module(x)` for a TE module that owns its parameters: one module per (x's
    device, the parameters' shapes), made by `make(x)`, the op's parameters copied into its `names` under
    no_grad before every call. TE's backward reads the module's own parameters (a functional call with
    them gives a wrong dx), so their gradients land on TE's parameters and are not reported: the row
    declares x's gradient only."""
    modules: dict = {}

    def call(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        key = (x.device, *(tuple(p.shape) for p in params))
        module = modules.get(key)
        if module is None:
            module = modules[key] = make(x)
        with torch.no_grad():
            for name, value in zip(names, params):
                getattr(module, name).copy_(value)
        return module(x)

    return call
