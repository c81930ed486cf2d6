"""One "run" of an implementation, as every probe performs it, and bitwise row comparison."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from harness.adapter import OpCallable
from harness.ops.base import OpInputs


@dataclass
class Outcome:
    output: torch.Tensor
    grads: dict[str, torch.Tensor]


def make_leaves(inputs: OpInputs, grads: tuple[str, ...]) -> list[torch.Tensor]:
    """Fresh leaves in call order; only the inputs in `grads` require grad. Strides are kept, so a
    table view stays a strided view, as in the model."""
    return [t.detach().requires_grad_() if name in grads else t
            for name, t in inputs.tensors.items()]


def execute(fn: OpCallable, inputs: OpInputs, grad_out: Optional[torch.Tensor],
            grads: tuple[str, ...]) -> Outcome:
    """Forward, then (when the row has gradients and `grad_out` is given) backward with `grad_out`."""
    backward = bool(grads) and grad_out is not None
    names = list(inputs.tensors)
    with torch.set_grad_enabled(backward):
        leaves = make_leaves(inputs, grads if backward else ())
        y = fn(*leaves)
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"implementation returned {type(y).__name__}, expected a tensor")
        if grad_out is not None and y.shape != grad_out.shape:
            raise ValueError(f"implementation returned shape {tuple(y.shape)}, expected "
                             f"{tuple(grad_out.shape)}")
        found: dict[str, torch.Tensor] = {}
        if backward:
            y.backward(grad_out)
            for name, leaf in zip(names, leaves):
                if name in grads:
                    if leaf.grad is None:
                        raise RuntimeError(f"implementation declares gradient {name!r} but produced none")
                    found[name] = leaf.grad
    return Outcome(output=y.detach(), grads=found)


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers: bitwise equality, so NaN == NaN and -0.0 != 0.0."""
    return t.contiguous().view(_SAME_SIZE_INT[t.element_size()])


def rows_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row (first dimension), whether a and b differ in any bit. Returns a bool tensor on device."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.ones(a.shape[0] if a.dim() else 1, dtype=torch.bool, device=a.device)
    return (as_bits(a) != as_bits(b)).reshape(a.shape[0], -1).any(dim=1)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(as_bits(a), as_bits(b)))
