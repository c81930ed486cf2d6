"""`from h3bench.kernels import <op>`: the public kernel API is the seven functions, imported lazily."""
from __future__ import annotations

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


def test_importing_the_package_imports_no_kernel():
    code = "import sys, h3bench.kernels; print('triton' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
