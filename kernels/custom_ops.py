"""What the public functions' torch.library custom ops share (each op's are at the end of its `<op>_api.py`).

While dynamo traces (torch.compile, strict torch.export) a public function goes to its custom ops,
`h3bench::<op>` and, for the ops with gradients, `h3bench::<op>_backward`: each has a fake implementation
(the outputs' shapes, dtypes and strides from the inputs', after the eager call's argument checks) and the
forward op its registered autograd, so a compiled model captures the call without a graph break. An eager
call does not go through them: a custom op's dispatch costs more host time than the eager path it would
wrap (kernels/notes/custom_ops.md has the figures and the command).

The ops compute what the eager call computes: the forward op runs the eager call on detached inputs, the
launchers the eager paths call, or the eager autograd Function's own `forward` with a `Record` for its ctx,
and the backward op the Function's own `backward` on a `Record` rebuilt from the forward op's inputs and
outputs. A custom
op's output may not alias an input or another output, so what the eager forward saves as views of its
inputs (row layouts, contiguous copies) is made again from the inputs in the backward op, by the same
functions.
"""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch

# True while dynamo traces (torch.compile, strict torch.export: a constant in the traced code), False when code
# runs: a call of a `return False` (torch.compiler.is_compiling reads a global flag that a compile in any thread
# sets, at three times the cost)
compiling = torch.compiler.is_dynamo_compiling


class Record:
    """Stands in for an autograd Function's ctx where a custom op calls the Function's forward or backward
    itself: keeps what forward saves, gives backward what it reads (saved tensors, attributes, the inputs'
    needs_input_grad)."""

    def __init__(self, saved_tensors: tuple = (), needs_input_grad: Sequence[bool] = (), **attributes):
        self.saved_tensors = tuple(saved_tensors)
        self.needs_input_grad = tuple(needs_input_grad)
        self.__dict__.update(attributes)

    def save_for_backward(self, *tensors: Optional[torch.Tensor]) -> None:
        self.saved_tensors = tensors


def absent(like: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The empty tensor a custom op returns where the eager function has None (an op returns tensors only)."""
    return like.new_empty(0, dtype=dtype)


def present(values: Sequence[Optional[torch.Tensor]], like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`values` with each None as `absent(like)`."""
    return tuple(absent(like) if v is None else v for v in values)


def needed(grads: Sequence[torch.Tensor], needs: Sequence[bool]) -> tuple[Optional[torch.Tensor], ...]:
    """A backward op's gradients as autograd takes them: None for an input that needs none."""
    return tuple(g if need else None for g, need in zip(grads, needs))


def require_training(ctx, op: str) -> None:
    """A forward op's backward needs what only its `training` mode keeps."""
    if not ctx.training:
        raise RuntimeError(f"h3bench::{op} ran with training=False: it kept nothing for a backward")


def config_fields(config) -> list[int]:
    """A launch config (a dataclass of ints, a field possibly None) as a custom op takes it: its field
    values in order, None as -1; [] for None (the op's default configuration)."""
    if config is None:
        return []
    return [-1 if v is None else v for v in config.__dict__.values()]


def config_of(cls, fields: Sequence[int]):
    """`config_fields`'s inverse: an instance of `cls`, or None for []."""
    if not fields:
        return None
    return cls(*(None if v == -1 else v for v in fields))


def on_device(t: torch.Tensor):
    """A CUDA tensor's device made current for the launches (triton launches on the current device), as the
    eager functions do; otherwise nothing."""
    if t.is_cuda and t.get_device() != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()
