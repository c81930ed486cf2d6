"""`launch(kernel, grid, *args, **meta)`: `kernel[grid](*args, **meta)` minus triton's per-call Python.

On the lent H200 VM `kernel[grid](...)` costs 16 us of host time in a tight loop and ~58 us inside a
forward+backward, where the norm_modulate backward is host-bound (kernels/NOTES.md, v12); calling the
compiled kernel's own launcher costs 7 us. What is skipped: triton's option parsing, its cache-key
string, the check of global values, grid canonicalization and launch metadata.

What is kept, so nothing can launch a kernel compiled for other arguments: triton's own binder runs on
every call, and the compiled kernel is looked up by the specialization it returns (dtypes, 16-byte
alignment of pointers, divisibility of integers, constexpr values) plus the launch options. A miss
goes through `kernel[grid]`, which compiles if needed, and remembers the result. The plain path is
taken whenever the fast one could differ: under the interpreter, with a launch hook installed (a
profiler's), on a triton whose internals do not look as expected, or with H3BENCH_FAST_LAUNCH=0.
"""
from __future__ import annotations

import os

import torch

try:
    from triton import knobs as _knobs
except ImportError:  # a triton without knobs: `_hooks_installed` then always sends launches the plain way
    _knobs = None

ENABLED = os.environ.get("H3BENCH_FAST_LAUNCH", "1") != "0"
# Read once, as triton does when it decorates a kernel: the interpreter cannot be switched on later.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_COMPILED: dict = {}


def _hook_set(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooks_installed() -> bool:
    """A launch hook is set. Triton 3.6 keeps them as HookChain objects, empty unless one was added."""
    if _knobs is None:
        return True
    return _hook_set(_knobs.runtime.launch_enter_hook) or _hook_set(_knobs.runtime.launch_exit_hook)


def launch(kernel, grid: tuple[int, ...], *args, **meta) -> None:
    if not ENABLED or INTERPRETED:
        kernel[grid](*args, **meta)
        return
    device = torch.cuda.current_device()
    try:
        binder = kernel.device_caches[device][4]
        bound, specialization, _ = binder(*args, **meta)
        key = (kernel, device, tuple(specialization), tuple(meta.items()))
        compiled = _COMPILED.get(key)
    except Exception:  # a triton whose internals differ: its own path is always right
        kernel[grid](*args, **meta)
        return
    if compiled is None or _hooks_installed():
        compiled = kernel[grid](*args, **meta)
        if compiled is not None and not hasattr(compiled, "result"):  # not an async-compile future
            _COMPILED[key] = compiled
        return
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    compiled.run(g0, g1, g2, torch._C._cuda_getCurrentRawStream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *bound.values())
