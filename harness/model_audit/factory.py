"""The model a factory returns, made checkable: `ATTR(device)` returns `(model, examples, per_row)`; the
model is called with the examples as keyword arguments and every tensor in what it returns (a tensor, a
tuple, a dict or a ModelOutput, nested) is an output; its parameters that require grad become shared
inputs (through torch.func.functional_call), so their gradients are checked for repeating bitwise as a
parameter's are. Every mistake is one line (BadModel): the spec, the factory, what it returned, the
examples, the model's first call on them, a model too large for the device."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from h3bench.harness.execute import describe_exception
from h3bench.harness.ops.from_examples import check_examples
from h3bench.harness.user_code import import_from_cwd, load_file

PARAM = "param:"  # the prefix of a parameter's input name


class BadModel(ValueError):
    """The model's spec, factory or first call is wrong: one line, exit 2."""


@dataclass
class Checkable:
    """What the assertion runs: `fn` over `examples` (the factory's, then the parameters), `per_row`, the
    module its modules are named from (`root`), output names and the factory's examples alone."""

    fn: Callable
    call: Callable  # the model alone on the examples' names, its outputs as a tuple (no parameter inputs)
    examples: dict[str, torch.Tensor]
    per_row: list[str]
    root: Optional[torch.nn.Module]
    model_type: str
    inputs: dict[str, torch.Tensor]
    output_names: list[str]
    out_dtypes: tuple[torch.dtype, ...]


def load_factory(spec: str) -> Callable:
    target, sep, attr = spec.strip().rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise BadModel(f"{spec}: expected PATH/FILE.py:ATTR or package.module:ATTR")
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target).expanduser().resolve()
            if not path.is_file():
                raise BadModel(f"{spec}: no such file {str(path)!r}")
            module = load_file(path, "h3bench_model")
        else:
            module = import_from_cwd(target)
    except BadModel:
        raise
    except Exception as exc:
        raise BadModel(f"{spec}: importing {target} raised {describe_exception(exc)}") from None
    if module is None or not hasattr(module, attr):
        raise BadModel(f"{spec}: {target} has no attribute {attr!r}")
    factory = getattr(module, attr)
    if not callable(factory):
        raise BadModel(f"{spec}: {attr} is a {type(factory).__name__}, not a factory ATTR(device)")
    return factory


def _too_large(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def outputs_of(result: Any) -> list[tuple[str, torch.Tensor]]:
    """Every tensor in a model's result, named by where it sits (`logits`, `out0`, `out.1`)."""
    found: list[tuple[str, torch.Tensor]] = []

    def walk(value: Any, name: str) -> None:
        if isinstance(value, torch.Tensor):
            found.append((name or "out", value))
        elif isinstance(value, dict) or hasattr(value, "items") and hasattr(value, "keys"):
            for k, v in value.items():
                walk(v, f"{name}.{k}" if name else str(k))
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                walk(v, f"{name}.{i}" if name else f"out{i}")

    walk(result, "")
    return found


def build(spec: str, device: torch.device, dtype: Optional[torch.dtype], grads: bool = True) -> Checkable:
    """The factory's model, checked once on its examples, as the assertion's function."""
    factory = load_factory(spec)
    try:
        made = factory(device)
    except Exception as exc:
        if _too_large(exc):
            raise BadModel(f"{spec}: the model does not fit on {device} ({describe_exception(exc)})") from None
        raise BadModel(f"{spec}: the factory raised {describe_exception(exc)}") from None
    if not (isinstance(made, tuple) and len(made) == 3):
        raise BadModel(f"{spec}: the factory returned {type(made).__name__}"
                       f"{f' of {len(made)}' if isinstance(made, tuple) else ''}, expected (model, examples, per_row)")
    model, examples, per_row = made
    if not callable(model):
        raise BadModel(f"{spec}: the model is a {type(model).__name__}, not callable")
    per_row = [per_row] if isinstance(per_row, str) else list(per_row or [])
    try:
        check_examples(examples, per_row)
    except (TypeError, ValueError) as exc:
        raise BadModel(f"{spec}: {exc}") from None
    if dtype is not None:
        if isinstance(model, torch.nn.Module):
            model = model.to(dtype)
        examples = {k: (v.detach().to(dtype).requires_grad_(v.requires_grad) if v.is_floating_point() else v)
                    for k, v in examples.items()}
    return _checkable(spec, model, dict(examples), per_row, grads)


def _checkable(spec: str, model, examples: dict, per_row: list[str], grads: bool) -> Checkable:
    root = model if isinstance(model, torch.nn.Module) else None
    params = {n: p for n, p in root.named_parameters()} if root is not None and grads else {}
    names = list(examples)

    def fn(**kw):
        given = {n: kw[n] for n in names}
        if params:
            swapped = {n: kw[PARAM + n] for n in params}
            result = torch.func.functional_call(root, swapped, args=(), kwargs=given, strict=False)
        else:
            result = model(**given)
        return tuple(t for _, t in outputs_of(result))

    everything = {**examples, **{PARAM + n: p for n, p in params.items() if p.requires_grad}}
    try:
        with torch.no_grad():
            found = outputs_of(model(**examples))
    except Exception as exc:
        if _too_large(exc):
            raise BadModel(f"{spec}: the model does not fit on its device ({describe_exception(exc)})") from None
        raise BadModel(f"{spec}: the model raised on its examples: {describe_exception(exc)}") from None
    rows = examples[per_row[0]].shape[0]
    if not found:
        raise BadModel(f"{spec}: the model returned no tensor")
    for name, t in found:
        if t.dim() == 0 or t.shape[0] != rows:
            raise BadModel(f"{spec}: output {name!r} has shape {tuple(t.shape)}: every output tensor's first "
                           f"dimension must be the rows ({rows})")
    def call(**kw):
        return tuple(t for _, t in outputs_of(model(**kw)))

    return Checkable(fn=fn, call=call, examples=everything, per_row=per_row, root=root, model_type=type(model).__name__,
                     inputs=dict(examples), output_names=[n for n, _ in found],
                     out_dtypes=tuple(t.dtype for _, t in found))
