"""Loading a user's code, for `--adapter` (harness/adapter.py) and `--op` (harness/op_source.py) alike: a .py
file by its path, or a module by name with the current directory on the path (as `python -m` has it, for the
console script too); and which of an op's constants a user's function takes as keyword arguments."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator, Optional


def load_file(path: Path, prefix: str) -> Optional[ModuleType]:
    """The module of the .py file `path`, under a name unique to the path (registered in sys.modules:
    dataclasses and pickling look modules up by name; taken out again when running the file raises, which
    propagates). None when the file is no Python source."""
    unique = f"{prefix}_{abs(hash(str(path)))}_{path.stem}"
    found = importlib.util.spec_from_file_location(unique, path)
    if found is None or found.loader is None:
        return None
    module = importlib.util.module_from_spec(found)
    sys.modules[unique] = module
    try:
        found.loader.exec_module(module)
    except BaseException:
        del sys.modules[unique]
        raise
    return module


@contextlib.contextmanager
def cwd_on_path() -> Iterator[None]:
    """The current directory first on sys.path for the block (unless it is there already)."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            sys.path.remove(cwd)


def import_from_cwd(name: str) -> ModuleType:
    with cwd_on_path():
        return importlib.import_module(name)


def accepted_constants(fn: Callable, constants: tuple[str, ...]) -> tuple[str, ...]:
    """The op constants `fn` takes as keyword arguments (by name, or all of them through **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return ()
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return constants
    return tuple(c for c in constants if c in params and params[c].kind in (inspect.Parameter.KEYWORD_ONLY,
                                                                             inspect.Parameter.POSITIONAL_OR_KEYWORD))
