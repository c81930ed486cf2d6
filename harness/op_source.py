"""`--op TEXT` -> the Op it names: a built-in op's name, `path/to/file.py:ATTR`, `package.module:ATTR`, or a
name in the `h3bench.ops` entry-point group (an installed package's op).

ATTR is an op declaration (harness/ops/public.py: UserOp) or an `Op` instance. A resolved user op is
registered by name in this process (harness/ops: register_declared), so everything after the CLI finds it
with `get_op` as it finds a built-in op; `spec_of` gives the text that resolves it again in a mode's child
process. Every mistake is one line (a ValueError): the file or attribute missing, the attribute not a
declaration (and what it is), the declaration inconsistent, or its own code failing on a small case
(`check`).
"""
from __future__ import annotations

import inspect
import os
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import torch

from h3bench.harness.execute import describe_exception as _describe
from h3bench.harness.ops import DECLARED_SOURCES, OP_MODULES, get_op, known, register_declared
from h3bench.harness.ops.base import Op
from h3bench.harness.ops.declared import DeclaredOp, UserOpError
from h3bench.harness.ops.public import UserOp
from h3bench.harness.user_code import import_from_cwd, load_file

ENTRY_POINT_GROUP = "h3bench.ops"
FORMS = "or a user op: PATH/FILE.py:ATTR, package.module:ATTR, or a name in the h3bench.ops entry-point group"


def resolve(text: str) -> Op:
    """The op `text` names (see the module's docstring), registered in this process."""
    text = text.strip()
    if known(text):
        return get_op(text)
    target, sep, attr = text.rpartition(":")
    if sep:
        if not target or not attr.isidentifier():
            raise ValueError(f"--op {text}: expected PATH/FILE.py:ATTR or package.module:ATTR")
        path = _file_path(target)
        spec = f"{path}:{attr}" if path is not None else f"{target}:{attr}"
        if spec in DECLARED_SOURCES.values():  # resolved before in this process: the same op
            return get_op(next(name for name, s in DECLARED_SOURCES.items() if s == spec))
        module = _load_file(path, text) if path is not None else _import_module(target, text)
        if not hasattr(module, attr):
            found = [name for name, value in vars(module).items() if isinstance(value, (UserOp, Op))]
            raise ValueError(f"--op {text}: {target} has no attribute {attr!r}"
                             + (f" (op declarations there: {', '.join(found)})" if found else ""))
        op = as_op(getattr(module, attr), spec, text, path.parent if path is not None else None)
    else:
        spec = text
        op = as_op(_entry_point(text), spec, text, None)
    if op.name in OP_MODULES:
        raise ValueError(f"--op {text}: declares op {op.name!r}, a built-in op's name: name yours otherwise")
    register_declared(op, spec)
    return op


def spec_of(name: str) -> str:
    """The `--op` text that resolves op `name` in another process of the run: its name for a built-in op
    (or one from the entry-point group), the absolute file path or module and the attribute otherwise."""
    return DECLARED_SOURCES.get(name, name)


def check(name: str, params: Any, device: torch.device) -> None:
    """A user op's declaration run once on a small case with the run's constants on the run's device
    (DeclaredOp.check): its own failure is a UserOpError naming it. Built-in ops are not checked."""
    op = get_op(name)
    if isinstance(op, DeclaredOp):
        op.check(params, device)


def as_op(obj: Any, spec: str, text: str, base_dir: Optional[Path]) -> Op:
    if isinstance(obj, UserOp):
        return DeclaredOp(obj, spec, base_dir)
    if isinstance(obj, Op):
        return obj
    raise UserOpError(f"--op {text}: is {_what(obj)}, not an op declaration (declare it with "
                      f"h3bench.harness.ops.UserOp; docs/examples/rms_norm_op.py)")


def _what(obj: Any) -> str:
    if inspect.isclass(obj):
        return f"the class {obj.__qualname__}" + (" (an Op subclass: give an instance)" if issubclass(obj, Op) else "")
    if inspect.ismodule(obj):
        return f"the module {obj.__name__}"
    if callable(obj):
        return f"a {type(obj).__name__} ({getattr(obj, '__qualname__', type(obj).__name__)})"
    shown = repr(obj)
    return f"a {type(obj).__name__} ({shown if len(shown) <= 60 else shown[:57] + '...'})"


def _file_path(target: str) -> Optional[Path]:
    """The .py file `target` names, resolved; None when `target` is a module name."""
    if not (target.endswith(".py") or os.sep in target or "/" in target):
        return None
    return Path(target).expanduser().resolve()


def _load_file(path: Path, text: str):
    if not path.is_file():
        raise ValueError(f"--op {text}: no such file {str(path)!r}")
    try:
        module = load_file(path, "h3bench_user_op")
    except Exception as exc:
        raise UserOpError(f"--op {text}: importing {path} raised {_describe(exc)}") from exc
    if module is None:
        raise ValueError(f"--op {text}: {path} is not a Python file")
    return module


def _import_module(name: str, text: str):
    """A module by name, the current directory on the path as `python -m` would have it."""
    try:
        return import_from_cwd(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise ValueError(f"--op {text}: no module named {exc.name!r}") from None
        raise UserOpError(f"--op {text}: importing {name} raised {_describe(exc)}") from exc
    except Exception as exc:
        raise UserOpError(f"--op {text}: importing {name} raised {_describe(exc)}") from exc


def _entry_point(name: str) -> Any:
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.load()
            except Exception as exc:
                raise UserOpError(f"--op {name}: entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}) raised "
                                  f"{_describe(exc)}") from exc
    raise ValueError(f"unknown op {name!r}; known ops: {', '.join(OP_MODULES)}; {FORMS}")
