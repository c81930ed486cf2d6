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
    them gives a wrong dx), so the module runs on its own parameters and `_OwnParameters` hands their
    gradients, as TE's backward computed them, to the op's parameters: the row reports x's and the
    parameters' gradients, TE's dW and dgamma reductions included."""
    modules: dict = {}

    def call(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        key = (x.device, *(tuple(p.shape) for p in params))
        module = modules.get(key)
        if module is None:
            module = modules[key] = make(x)
        owned = tuple(getattr(module, name) for name in names)
        with torch.no_grad():
            for mine, value in zip(owned, params):
                mine.copy_(value)
        if not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params))):
            return module(x)
        return _OwnParameters.apply(module, owned, x, *params)

    return call


class _OwnParameters(torch.autograd.Function):
    """`module(x)` in the graph of x and the op's parameters: forward records TE's own graph on a detached
    x and the module's parameters, backward runs it and returns x's gradient and the module parameters'
    gradients as the op's (the same bits TE's backward wrote; nothing is recomputed or summed here)."""

    @staticmethod
    def forward(ctx, module, owned, x, *params):
        # TE's graph (its saved activations) lives on ctx as long as this node: until the output is freed
        inner_x = x.detach().requires_grad_(x.requires_grad)
        with torch.enable_grad():
            out = module(inner_x)
        ctx.inner = (inner_x, owned, out)
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        inner_x, owned, out = ctx.inner
        wanted = ([inner_x] if ctx.needs_input_grad[2] else []) + \
            [p for p, need in zip(owned, ctx.needs_input_grad[3:]) if need]
        got = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        dx = next(got) if ctx.needs_input_grad[2] else None
        return (None, None, dx, *(next(got) if need else None for need in ctx.needs_input_grad[3:]))
