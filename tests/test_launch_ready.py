"""kernels.common.launch_ready: the binder-free launch (GPU-only in use, tested here with a fake kernel and
with the real timestep_sinusoid kernel's declaration checked through triton's own specializer)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from h3bench.kernels import common


class FakeCompiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, runs: list):
        self.runs = runs

    def run(self, *a):
        self.runs.append(a)


class FakeKernel:
    """A kernel (X pointer, n int, BLOCK constexpr): `plain` records launches through kernel[grid], `runs`
    those through the compiled kernel's own launcher, `binds` the binder's calls; `n_specialized` makes n
    specialized on its value."""

    def __init__(self, n_specialized: bool = False, x_aligned_only: bool = False):
        self.plain, self.runs, self.binds = [], [], 0
        self.compiled = FakeCompiled(self.runs)
        self.n_specialized, self.x_aligned_only = n_specialized, x_aligned_only
        self.params = [SimpleNamespace(name="X", is_constexpr=False, do_not_specialize=False,
                                       do_not_specialize_on_alignment=not x_aligned_only),
                       SimpleNamespace(name="n", is_constexpr=False, do_not_specialize=not n_specialized,
                                       do_not_specialize_on_alignment=False),
                       SimpleNamespace(name="BLOCK", is_constexpr=True, do_not_specialize=False,
                                       do_not_specialize_on_alignment=False)]
        self.device_caches = {0: (None, None, None, None, self.binder)}

    def binder(self, x, n, BLOCK, **options):
        self.binds += 1
        x_attr = ("D" if x.data_ptr() % 16 == 0 else "") if self.x_aligned_only else None
        n_spec = ("i32", "D" if n % 16 == 0 else "") if self.n_specialized else (
            "i32" if -(1 << 31) <= n < (1 << 31) else "i64", None)
        return {"X": x, "n": n, "BLOCK": BLOCK}, [("*fp32", x_attr), n_spec, ("constexpr", BLOCK)], options

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.plain.append((grid, args, meta))
            return self.compiled
        return launch


@pytest.fixture
def gpu_like(monkeypatch):
    """The fast paths switched on as on a GPU, with no CUDA: stream 0, no hooks, empty caches."""
    monkeypatch.setattr(common, "ENABLED", True)
    monkeypatch.setattr(common, "INTERPRETED", False)
    monkeypatch.setattr(common, "_hooks_installed", lambda: False)
    monkeypatch.setattr(common, "_COMPILED", {})
    monkeypatch.setattr(common, "_READY", {})
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)


META = (("BLOCK", 64), ("num_warps", 4))


def binds_per_call(kernel, calls) -> list[int]:
    """How many times each call ran the binder."""
    found = []
    for key, args, meta in calls:
        before = kernel.binds
        common.launch_ready(kernel, (1,), 0, key, args, meta)
        found.append(kernel.binds - before)
    return found


def test_second_call_skips_the_binder_and_passes_args_then_constexprs(gpu_like):
    kernel, x = FakeKernel(), torch.zeros(8)
    common.launch_ready(kernel, (3,), 0, torch.float32, (x, 5), META)
    assert len(kernel.plain) == 1 and not kernel.runs  # compiled by triton's own path
    binds = kernel.binds
    common.launch_ready(kernel, (4, 2), 0, torch.float32, (x, 6), META)
    assert kernel.binds == binds and len(kernel.plain) == 1
    assert kernel.runs == [(4, 2, 1, 7, "fn", "meta", None, None, None, x, 6, 64)]


def test_a_new_key_or_meta_goes_through_the_binder_first(gpu_like):
    kernel, x = FakeKernel(), torch.zeros(8)
    other = (("BLOCK", 128), ("num_warps", 4))
    calls = [(torch.float32, (x, 5), META), (torch.float16, (x, 5), META), (torch.float32, (x, 5), other),
             (torch.float16, (x, 9), META), (torch.float32, (x, 9), other)]
    assert [b > 0 for b in binds_per_call(kernel, calls)] == [True, True, True, False, False]


def test_an_integer_beyond_int32_takes_the_binder(gpu_like):
    kernel, x = FakeKernel(), torch.zeros(8)
    calls = [(torch.float32, (x, 5), META), (torch.float32, (x, 1 << 33), META), (torch.float32, (x, 6), META)]
    assert [b > 0 for b in binds_per_call(kernel, calls)] == [True, True, False]


@pytest.mark.parametrize("shape", ["n_specialized", "x_unaligned_specialized"])
def test_a_kernel_specialized_on_values_is_never_launched_binder_free(gpu_like, shape):
    if shape == "n_specialized":
        kernel, x = FakeKernel(n_specialized=True), torch.zeros(8)
    else:  # X specialized on alignment and seen unaligned: a later aligned X would need other code
        kernel, x = FakeKernel(x_aligned_only=True), torch.zeros(9)[1:]
    calls = [(torch.float32, (x, n), META) for n in (5, 6, 7)]
    assert all(b > 0 for b in binds_per_call(kernel, calls))
    assert not common._READY


def test_hooks_or_disabled_fast_launch_take_triton_s_path(gpu_like, monkeypatch):
    kernel, x = FakeKernel(), torch.zeros(8)
    common.launch_ready(kernel, (1,), 0, torch.float32, (x, 5), META)
    monkeypatch.setattr(common, "_hooks_installed", lambda: True)
    common.launch_ready(kernel, (1,), 0, torch.float32, (x, 5), META)
    monkeypatch.setattr(common, "_hooks_installed", lambda: False)
    monkeypatch.setattr(common, "ENABLED", False)
    common.launch_ready(kernel, (1,), 0, torch.float32, (x, 5), META)
    assert len(kernel.plain) == 3 and not kernel.runs


def _real_specialization(jit, args, meta):
    """What triton's binder returns for these arguments (its generated function, written out)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    given = dict(meta)
    values = list(args) + [given[p.name] for p in jit.params[len(args):]]
    spec = [("constexpr", v) if p.is_constexpr else
            native_specialize_impl(BaseBackend, v, p.is_const, not p.do_not_specialize,
                                   not p.do_not_specialize_on_alignment)
            for p, v in zip(jit.params, values)]
    return [p.name for p in jit.params], spec


def test_sinusoid_kernel_depends_on_t_dtype_alone():
    """The real kernel's declaration: for every t (aligned or not, any stride) and row count, triton
    specializes it the same way for one dtype, and `ready_specialization` accepts it."""
    from triton.runtime.jit import JITFunction

    from h3bench.kernels import timestep_sinusoid_kernel as S

    kernel = S._sinusoid_kernel
    jit = kernel if hasattr(kernel, "params") else JITFunction(kernel.fn, **kernel.kwargs)
    meta = (("HALF", 128), ("BLOCK_K", 128), ("ROWS", 8), ("INTERPRETED", False))
    freqs, base = torch.zeros(128, dtype=torch.float64), torch.zeros(64)
    seen = set()
    for t, rows in ((base, 64), (base[1:], 63), (base[::2], 32), (base[3:4], 1), (base[:16], 16)):
        out = torch.empty(rows, 256)
        names, spec = _real_specialization(jit, (t, freqs, out, rows, t.stride(0)), meta)
        tail, ints = common.ready_specialization(jit, names, spec, 5, meta)
        assert tail == (128, 128, 8, False) and ints == (3, 4)
        seen.add(tuple(spec))
    assert len(seen) == 1
