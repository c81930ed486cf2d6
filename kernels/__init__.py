"""h3bench's Triton kernels, one public function per operator, each batch-invariant by construction (a
row's output and gradients do not depend on the batch it rides in; parameter gradients repeat bitwise):

    from h3bench.kernels import norm_modulate, timestep_sinusoid, timestep_mlp, adaln_projection, \\
        adaln_row_gather, gate_residual, final_adaln_out

Each is a plain function with autograd (timestep_sinusoid: forward only); its docstring gives inputs, shapes
and dtypes, and `kernels/notes/<op>.md` its design. Under torch.compile each call is captured as torch.library
custom ops (`h3bench::<op>`, with fake implementations and registered autograd: kernels/custom_ops.py), so a
model compiles with fullgraph=True and gives the eager call's bits. They run on CUDA, or on the CPU under the
Triton interpreter (TRITON_INTERPRET=1 set before triton is imported). A name is imported on first use, so
`import h3bench.kernels` alone imports neither triton nor torch's CUDA runtime.

Every op has two modules: `<op>_api.py`, the public function (its docstring, argument checks and autograd
node, and its custom ops), and `<op>_kernel.py`, what it launches (its @triton.jit kernels, or for the GEMM
ops the launch configurations of kernels/gemm.py's kernels, and the forward and backward launch sequences).
No module is named after a public function: importing a submodule binds its name on this package, which
would then hide the function of that name.
"""
from __future__ import annotations

import importlib

# public name -> the module that defines it
_PUBLIC = {
    "norm_modulate": "norm_modulate_api",
    "timestep_sinusoid": "timestep_sinusoid_api",
    "timestep_mlp": "timestep_mlp_api",
    "adaln_projection": "adaln_projection_api",
    "adaln_row_gather": "adaln_row_gather_api",
    "gate_residual": "gate_residual_api",
    "final_adaln_out": "final_adaln_out_api",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    function = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = function  # once: later lookups are plain attribute reads
    return function


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
