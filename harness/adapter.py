"""The one interface every implementation is wrapped in.

An adapter names a row of the evidence file (rows are keyed by op and name), says which gradients it
produces, and knows how to load its implementation for a device and the op's parameters (its constants:
eps, table layout, widths), so nothing about an op is hard-coded in an adapter. Loading is lazy:
importing an adapter module must never import the library it wraps, so a missing or broken library
becomes an "unavailable" row instead of a crash.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from h3bench.harness.execute import describe_exception
from h3bench.harness.schema import SKIPPED
from h3bench.harness.user_code import accepted_constants, import_from_cwd, load_file

OpCallable = Callable[..., Any]  # the op's inputs in call order -> a tensor, or a tuple of the op's outputs


class RowSkipped(Exception):
    """Raised by a row's `load` that deliberately does not run here (not a failure): its reason is
    recorded as "skipped on CPU: <why>", without an exception type."""

    def __init__(self, why: str):
        super().__init__(f"{SKIPPED}{why}")


@dataclass
class CompileTally:
    """What compiling cost a row that compiles when called (torch.compile): the seconds spent in
    compilations and how many there were, filled in by the row as it runs; `overrun`: why the row gave
    up (its compile budget spent), or None."""

    seconds: float = 0.0
    compiles: int = 0
    overrun: Optional[str] = None
    mode: str = ""                    # the compile mode, as torch.compile names it ("default", "max-autotune...")
    # the seconds the compilations may take together: given by the row, else set by the run from its plan's
    # [compile] table before the row's first call (harness/config.py CompilePlan)
    budget_s: Optional[float] = None


@dataclass(frozen=True)
class Loaded:
    """A ready implementation: `fn` has the op's signature, `source` names library and version;
    `compile_tally`: where a row that compiles on its calls counts that cost (None: it does not)."""

    fn: OpCallable
    source: str
    compile_tally: Optional[CompileTally] = None
    # `source` in a few words where it runs long (torch.compile's rows name every Inductor setting), for
    # `h3bench list`'s table; None: `source` is short. The file and `list --op` keep the whole source.
    brief: Optional[str] = None

    @property
    def short_source(self) -> str:
        return self.brief or self.source


@dataclass(frozen=True)
class Adapter:
    """One row of the evidence file.

    `grads` lists the op inputs whose gradients this implementation produces (a subset of the op's
    differentiable inputs); an empty tuple means forward only. `load(device, params)` imports the library
    and returns the callable, raising (ImportError, RuntimeError, ...) when it cannot run on `device`;
    `params` is the op's parameter record (e.g. NormModulateParams).
    """

    name: str
    op: str
    grads: tuple[str, ...]
    load: Callable[[torch.device, Any], Loaded]
    summary: str = ""
    # the op's reference variant this row computes; None = the op itself. Rows that implement only
    # part of the op (the norm without modulation) are judged against that part.
    reference: Optional[str] = None
    # Why, on a CPU, the row runs only when named (`--adapters`) and is left out of the default rows
    # there (its cost does not fit the CPU quick plan); None: it is a default row everywhere.
    cpu_only_when_named: Optional[str] = None

    @property
    def has_backward(self) -> bool:
        return bool(self.grads)

    @property
    def key(self) -> tuple[str, str]:
        return (self.op, self.name)

    def try_load(self, device: torch.device, params: Any) -> "Loaded | str":
        """The loaded implementation, or the reason it is unavailable as "Type: message" (a deliberate skip:
        "skipped on CPU: why")."""
        try:
            return self.load(device, params)
        except RowSkipped as exc:  # a deliberate skip reads as one, not as an error
            return str(exc)
        except Exception as exc:  # every failure to load is a table cell, not a crash
            return describe_exception(exc)


def installed_version(distribution: str) -> str:
    """The installed version of a distribution, for source strings."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def unavailable_adapter(name: str, op: str, grads: tuple[str, ...], reason: str) -> Adapter:
    """A row whose implementation cannot even be found (a broken entry point): every load gives `reason`."""
    def load(_device: torch.device, _params: Any) -> Loaded:
        raise ImportError(reason)

    return Adapter(name=name, op=op, grads=grads, load=load, summary="could not be loaded")


def as_default_row(adapter: Adapter, device: torch.device) -> Adapter:
    """`adapter` as a row of the default selection on `device`: on a CPU, a row that runs there only when
    named becomes unavailable with its reason."""
    reason = adapter.cpu_only_when_named
    if device.type != "cpu" or reason is None:
        return adapter

    def load(_device: torch.device, _params: Any) -> Loaded:
        raise RowSkipped(f"{reason}; name it with --adapters {adapter.name} to run it")

    return dataclasses.replace(adapter, load=load)


def from_function(fn: OpCallable, *, name: str, op: str, differentiable: tuple[str, ...],
                  source: Optional[str] = None, constants: tuple[str, ...] = ()) -> Adapter:
    """Wrap a plain function with the op's signature: its gradients come from autograd. The op constants it
    accepts (`accepted_constants`) are passed as keyword arguments from the run's parameters, so `--set
    eps=...` reaches it."""
    label = source or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', name)} (autograd)"
    passed = accepted_constants(fn, constants)

    def load(_device: torch.device, params: Any) -> Loaded:
        if not passed:
            return Loaded(fn=fn, source=label)
        values = {c: getattr(params, c) for c in passed}
        return Loaded(fn=functools.partial(fn, **values),
                      source=f"{label}; constants {', '.join(f'{k}={v!r}' for k, v in values.items())}")

    return Adapter(name=name, op=op, grads=differentiable, load=load, summary="external function")


def _import_target(module_name: str, spec: str):
    """The module of `--adapter`: a path to a .py file, or a module name (the current directory included,
    as `python -m` would have it, for the console script too)."""
    if module_name.endswith(".py") or os.sep in module_name:
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"--adapter {spec}: no such file {module_name!r}")
        module = load_file(path, "h3bench_external")
        if module is None:
            raise ValueError(f"--adapter {spec}: {path} is not a Python file")
        return module
    return import_from_cwd(module_name)


def load_external(spec: str, *, op: str, differentiable: tuple[str, ...], n_inputs: int,
                  constants: tuple[str, ...] = (), forward_only: bool = False) -> Adapter:
    """Resolve `[name=]module:attr` (module: a module name or a path to a .py file) to an adapter. `attr`
    may be an Adapter or a plain function taking the op's inputs in call order (`n_inputs` of them) and,
    as keyword arguments, whichever of the op's `constants` it names. `name` names the row (default: attr);
    `forward_only`: the function has no backward (no gradients are asked of it)."""
    row_name, eq, target = spec.partition("=")
    if not eq:
        row_name, target = "", spec
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr or (eq and not row_name.strip()):
        raise ValueError(f"--adapter expects [name=]module:attr or [name=]path/to/file.py:attr, got {spec!r}")
    try:
        module = _import_target(module_name, spec)
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"--adapter {spec}: cannot import module {module_name!r} "
                         f"({describe_exception(exc)})") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"--adapter {spec}: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, Adapter):
        if obj.op != op:
            raise ValueError(f"--adapter {spec}: adapter is for op {obj.op!r}, not {op!r}")
        return replace(obj, name=row_name.strip()) if row_name.strip() else obj
    if callable(obj):
        _check_signature(obj, spec, n_inputs, accepted_constants(obj, constants))
        return from_function(obj, name=row_name.strip() or attr, op=op,
                             differentiable=() if forward_only else differentiable, constants=constants,
                             source=f"{target} (external function, "
                                    f"{'forward only' if forward_only else 'autograd'})")
    raise ValueError(f"--adapter {spec}: {attr!r} is neither an Adapter nor a callable")


def _check_signature(fn: Callable, spec: str, expected: int, constants: tuple[str, ...] = ()) -> None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return  # builtins without a signature: let the first call tell
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.name not in constants]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    required = [p for p in positional if p.default is p.empty]
    if len(positional) < expected or len(required) > expected:
        raise ValueError(f"--adapter {spec}: function takes {len(positional)} positional arguments, "
                         f"the op passes {expected} (`h3bench list --op NAME` shows the op's signature)")


def replace(adapter: Adapter, **changes) -> Adapter:
    return dataclasses.replace(adapter, **changes)
