"""`from h3bench.kernels import <op>`: the public kernel API is the seven functions, imported lazily."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import h3bench.kernels as kernels

SEVEN = ("norm_modulate", "timestep_sinusoid", "timestep_mlp", "adaln_projection", "adaln_row_gather",
         "gate_residual", "final_adaln_out")


def test_the_seven_functions():
    assert tuple(kernels.__all__) == SEVEN
    for name in SEVEN:
        fn = getattr(kernels, name)
        assert callable(fn) and fn.__name__ == name and fn.__doc__, name
        assert not isinstance(fn, type(kernels)), f"{name} is a module, not the function"
        assert fn.__module__ == f"h3bench.kernels.{name}_api", (name, fn.__module__)


def test_every_op_has_an_api_and_a_kernel_module_and_none_is_named_after_its_function():
    """The layout kernels/__init__.py states. A submodule named like a public function would, once imported
    (`from h3bench.kernels.norm_modulate import ...`), bind the module on the package in the function's
    place."""
    modules = {info.name for info in pkgutil.iter_modules(kernels.__path__)}
    assert not modules & set(SEVEN)
    missing = {f"{op}_{part}" for op in SEVEN for part in ("api", "kernel")} - modules
    assert not missing


def test_importing_the_package_imports_no_kernel():
    code = "import sys, h3bench.kernels; print('triton' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
