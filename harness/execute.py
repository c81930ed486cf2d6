"""One "run" of an implementation, as every probe performs it, bitwise row comparison, and blame.

Blame: only an exception raised inside the implementation's own code (its call, its backward) or a
result that breaks the op's contract (wrong type, count, shape or dtype of outputs; a declared gradient
not produced) is the implementation's fault. `implementation_code()` turns such exceptions into
`ImplementationError`, which the runner records as the row's reason. Every other exception is a harness
bug and stops the run.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

from h3bench.harness.ops.base import OpInputs


class ImplementationError(Exception):
    """The implementation under test failed or broke the op's contract; `__cause__` is the original."""

    def __init__(self, message: str):
        super().__init__(message)


@contextlib.contextmanager
def implementation_code() -> Iterator[None]:
    """Exceptions raised inside this block are the implementation's: keep the block to its own calls."""
    try:
        yield
    except ImplementationError:
        raise
    except Exception as exc:
        raise ImplementationError(describe_exception(exc)) from exc


def blamed(fn):
    """`fn` with its exceptions turned into ImplementationError: for the timed steps, where the
    context manager's cost would show in host-bound figures."""
    def wrapper(*args):
        try:
            return fn(*args)
        except Exception as exc:
            raise ImplementationError(describe_exception(exc)) from exc
    return wrapper


def describe_exception(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@dataclass
class Outcome:
    outputs: tuple[torch.Tensor, ...]
    grads: dict[str, torch.Tensor]


def make_leaves(inputs: OpInputs, grads: tuple[str, ...]) -> list[torch.Tensor]:
    """Fresh leaves in call order; only the inputs in `grads` require grad. Strides are kept, so a
    table view stays a strided view, as in the model."""
    return [t.detach().requires_grad_() if name in grads else t for name, t in inputs.tensors.items()]


def as_outputs(result, expected: int) -> tuple[torch.Tensor, ...]:
    """The implementation's return value as a tuple of `expected` tensors, or ImplementationError."""
    found = (result,) if isinstance(result, torch.Tensor) else result
    if not isinstance(found, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in found):
        raise ImplementationError(f"implementation returned {type(result).__name__}, expected "
                                  f"{'a tensor' if expected == 1 else f'{expected} tensors'}")
    if len(found) != expected:
        raise ImplementationError(f"implementation returned {len(found)} tensors, the op has {expected} outputs")
    return tuple(found)


def check_like(outputs: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
               names: Optional[Sequence[str]] = None) -> None:
    """The op's output contract: each output has the shape, dtype and device of the upstream gradient the
    op makes for it (`Op.make_grad_outs` builds those by the op's rule, e.g. [rows, H] in x's dtype). A
    float32 result for bf16 inputs would otherwise be judged more accurate than every real bf16 row.
    (Gradients need no check here: autograd gives each leaf's gradient the leaf's shape and dtype.)"""
    for i, (out, ref) in enumerate(zip(outputs, expected)):
        name = f"output {names[i]!r}" if names is not None and i < len(names) else f"output {i}"
        for what, got, want in (("shape", tuple(out.shape), tuple(ref.shape)), ("dtype", out.dtype, ref.dtype),
                                ("device", out.device, ref.device)):
            if got != want:
                raise ImplementationError(f"contract: {name} has {what} {got}, the op's is {want}")


def settle(tensors: Sequence) -> None:
    """Wait for the GPU work queued so far, so that a fault of a kernel just launched (an illegal
    address is reported asynchronously) is raised here, inside the implementation's block, and not
    later in harness code, which would blame the harness. Not used by the timed steps."""
    for device in {t.device for t in tensors if isinstance(t, torch.Tensor) and t.device.type == "cuda"}:
        torch.cuda.synchronize(device)


def device_usable(device: torch.device) -> bool:
    """False once a CUDA fault has left the context unusable (every later CUDA call fails)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        torch.zeros(1, device=device).item()
        return True
    except RuntimeError:
        return False


def call(fn, args: Sequence[torch.Tensor], n_outputs: int, settled: bool = True) -> tuple[torch.Tensor, ...]:
    """The implementation's forward; with `settled`, its kernels waited for inside its block (`settle`)."""
    with implementation_code():
        result = fn(*args)
        if settled:
            settle(args)
    return as_outputs(result, n_outputs)


def backward(outputs: Sequence[torch.Tensor], grad_outs: Sequence[torch.Tensor], settled: bool = True) -> None:
    """Backward through the implementation's graph (its own backward code runs here)."""
    pairs = [(o, g) for o, g in zip(outputs, grad_outs) if o.requires_grad]
    if not pairs:
        raise ImplementationError("implementation declares gradients but its outputs do not require grad")
    with implementation_code():
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        if settled:
            settle(outputs)


def execute(fn, inputs: OpInputs, grad_outs: Optional[Sequence[torch.Tensor]], grads: tuple[str, ...],
            n_outputs: int, output_names: Optional[Sequence[str]] = None, settled: bool = True) -> Outcome:
    """Forward, then (when the row has gradients and `grad_outs` is given) backward with `grad_outs`.
    `settled=False` leaves the kernels queued: for a caller that runs many calls and waits once, inside
    the implementation's block, before it reads a result back (harness/probes/context.py `settle`)."""
    run_backward = bool(grads) and grad_outs is not None
    names = list(inputs.tensors)
    with torch.set_grad_enabled(run_backward):
        leaves = make_leaves(inputs, grads if run_backward else ())
        outputs = call(fn, leaves, n_outputs, settled)
        if grad_outs is not None:
            check_like(outputs, grad_outs, output_names)
        found: dict[str, torch.Tensor] = {}
        if run_backward:
            backward(outputs, grad_outs, settled)
            for name, leaf in zip(names, leaves):
                if name in grads:
                    if leaf.grad is None:
                        raise ImplementationError(f"implementation declares gradient {name!r} but produced none")
                    found[name] = leaf.grad
    return Outcome(outputs=tuple(o.detach() for o in outputs), grads=found)


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers: bitwise equality, so NaN == NaN and -0.0 != 0.0."""
    return t.contiguous().view(_SAME_SIZE_INT[t.element_size()])


def rows_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row (first dimension), whether a and b differ in any bit. Returns a bool tensor on device."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.ones(a.shape[0] if a.dim() else 1, dtype=torch.bool, device=a.device)
    return (as_bits(a) != as_bits(b)).reshape(a.shape[0], -1).any(dim=1)


def any_rows_differ(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Per row, whether any of the (a, b) pairs differs there: one row's outputs taken together."""
    flags = [rows_differ(a, b) for a, b in pairs]
    out = flags[0]
    for f in flags[1:]:
        out = out | f
    return out


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(as_bits(a), as_bits(b)))
