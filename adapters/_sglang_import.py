"""Import single SGLang kernel modules without SGLang's serving stack.

`import sglang.kernels.ops.diffusion.norm.<module>` first executes the `__init__.py` of every
parent package. Four of those are heavy: `sglang/__init__.py` (frontend language, transformers
patches, cache-directory environment variables), `sglang.kernels` (the kernel registry, which
imports all twenty operator groups), `sglang.kernels.ops.diffusion` (registry entries for every
diffusion kernel; stubbing it also keeps `sglang.kernels.ops` from ever being imported) and
`sglang.srt.utils` (whose `network` module needs pyzmq). Registering those packages as bare
modules whose `__path__` points at the installed directories skips their bodies; the kernel
modules and everything they import themselves still load exactly as shipped.
COMPETITORS.md lists the third-party packages that remain.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

STUB_PACKAGES: tuple[str, ...] = (
    "sglang",
    "sglang.kernels",
    "sglang.kernels.ops.diffusion",
    "sglang.srt.utils",
)


def _stub_parents() -> None:
    if sys.modules.get("sglang") is not None:
        return  # already imported, for real or as our stub: children resolve through it
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'sglang'", name="sglang")
    root = list(spec.submodule_search_locations)[0]
    for name in STUB_PACKAGES:
        if name in sys.modules:
            continue
        path = os.path.join(root, *name.split(".")[1:])
        module = ModuleType(name, "stub: SGLang package body skipped by h3bench")
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__spec__.submodule_search_locations = [path]
        module.__path__ = [path]
        sys.modules[name] = module


def import_sglang_module(name: str) -> ModuleType:
    """`importlib.import_module(name)` for a module under `sglang`, skipping the stubbed bodies."""
    _stub_parents()
    return importlib.import_module(name)


def ensure_cutlass_dsl_on_path() -> None:
    """Do what `nvidia_cutlass_dsl_packages.pth` does at interpreter start.

    `pip install --target DIR` plus PYTHONPATH=DIR never runs `.pth` files, so `import cutlass`
    fails although nvidia-cutlass-dsl is installed; its packages live in
    `nvidia_cutlass_dsl/dsl_packages`.
    """
    if importlib.util.find_spec("cutlass") is not None:
        return
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    for base in (spec.submodule_search_locations or []) if spec else []:
        packages = os.path.join(base, "dsl_packages")
        if os.path.isdir(packages) and packages not in sys.path:
            sys.path.insert(0, packages)
            importlib.invalidate_caches()
            return
