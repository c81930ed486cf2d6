"""kernels.common.runner: the compiled kernel's C launcher called without `CudaLauncher.__call__` (GPU-only in
use; here against a transcription of triton 3.6.0's `CudaLauncher.__call__`, and on the GPU against the
real one in tests/test_kernel.py's launches)."""
from __future__ import annotations

import pytest
import torch

from h3bench.kernels import common


class CudaLauncher:
    """triton 3.6.0's `CudaLauncher.__call__` (triton/backends/nvidia/driver.py), its C `launch` recorded;
    scratch sizes as given."""

    def __init__(self, global_scratch: int = 0, profile_scratch: int = 0):
        self.calls = []
        self.launch = lambda *a: self.calls.append(a)
        self.num_ctas = 1
        self.global_scratch_size, self.global_scratch_align = global_scratch, 128
        self.profile_scratch_size, self.profile_scratch_align = profile_scratch, 128
        self.launch_cooperative_grid, self.launch_pdl = False, True

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):

        def allocate_scratch(size, align):
            if size > 0:
                return torch.empty(gridX * gridY * gridZ * self.num_ctas * size, dtype=torch.uint8)
            return None

        global_scratch = allocate_scratch(self.global_scratch_size, self.global_scratch_align)
        profile_scratch = allocate_scratch(self.profile_scratch_size, self.profile_scratch_align)
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                    global_scratch, profile_scratch, *args)


class Compiled:
    function, packed_metadata = 0xF00, (4, 1, 0)

    def __init__(self, launcher):
        self.run = launcher


@pytest.fixture
def triton_36(monkeypatch):
    monkeypatch.setattr(common, "DIRECT_VERSIONS", (common.triton.__version__,))
    monkeypatch.setattr(common, "DIRECT", True)


ARGS = (torch.zeros(4), None, 17, 1.5)


def launched_both_ways(compiled) -> tuple:
    """(the C launch's arguments through `runner`, through triton's own `compiled.run`)."""
    run, head = common.runner(compiled)
    run(3, 2, 1, 99, *head, *ARGS)
    compiled.run(3, 2, 1, 99, compiled.function, compiled.packed_metadata, None, None, None, *ARGS)
    return tuple(compiled.run.calls)


def test_the_direct_call_passes_the_c_launch_what_triton_s_call_does(triton_36):
    compiled = Compiled(CudaLauncher())
    run, _ = common.runner(compiled)
    assert run is compiled.run.launch  # really the direct path, not the plain one
    direct, plain = launched_both_ways(compiled)
    assert direct == plain


@pytest.mark.parametrize("scratch", [{"global_scratch": 64}, {"profile_scratch": 64}])
def test_a_kernel_with_scratch_memory_keeps_triton_s_call(triton_36, scratch):
    compiled = Compiled(CudaLauncher(**scratch))
    run, _ = common.runner(compiled)
    assert run is compiled.run
    direct, plain = launched_both_ways(compiled)
    where = 7 if "global_scratch" in scratch else 8
    assert isinstance(direct[where], torch.Tensor) and isinstance(plain[where], torch.Tensor)  # allocated
    same = [i for i in range(len(plain)) if i != where and not isinstance(plain[i], torch.Tensor)]
    assert [direct[i] for i in same] == [plain[i] for i in same] and direct[13] is plain[13] is ARGS[0]


def test_other_triton_versions_keep_triton_s_call(triton_36, monkeypatch):
    monkeypatch.setattr(common, "DIRECT_VERSIONS", ("0.0.0",))
    compiled = Compiled(CudaLauncher())
    assert common.runner(compiled)[0] is compiled.run


def test_switched_off_keeps_triton_s_call(triton_36, monkeypatch):
    monkeypatch.setattr(common, "DIRECT", False)
    compiled = Compiled(CudaLauncher())
    assert common.runner(compiled)[0] is compiled.run


def test_a_launcher_with_another_signature_keeps_its_call(triton_36):
    class CudaLauncherLater(CudaLauncher):  # triton 3.9's: kernel_metadata and the hooks named
        pass

    class Other(CudaLauncher):
        def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, *args):
            pass

    Other.__name__ = "CudaLauncher"
    for launcher in (CudaLauncherLater(), Other()):
        compiled = Compiled(launcher)
        assert common.runner(compiled)[0] is compiled.run


def test_a_launcher_without_the_expected_attributes_keeps_its_call(triton_36):
    launcher = CudaLauncher()
    del launcher.launch_pdl
    compiled = Compiled(launcher)
    assert common.runner(compiled)[0] is compiled.run


def test_on_the_gpu_the_direct_path_is_active_and_computes_the_same(device):
    """On triton 3.6.0 (the H200 machine) a real keyed launch takes the C launcher directly, and its output
    equals triton's own path's bitwise; elsewhere the check says why it cannot run."""
    if device.type != "cuda":
        pytest.skip("needs CUDA: on the CPU kernels run under the interpreter, where no launcher is called")
    if common.triton.__version__ not in common.DIRECT_VERSIONS or not common.DIRECT:
        pytest.skip(f"triton {common.triton.__version__} keeps CudaLauncher.__call__ (direct path for "
                    f"{common.DIRECT_VERSIONS} only)")
    from h3bench.kernels import timestep_sinusoid_api as S
    from h3bench.kernels import timestep_sinusoid_kernel as SK

    base = torch.linspace(0, 999, 154, device=device)
    for t in (base[:77], base[1::2], base.half()[3:80], base.double(), base[5:6]):
        first = S.timestep_sinusoid(t)
        second = S.timestep_sinusoid(t)  # the recipe's int-pointer launch of the first call's entry
        third = S.timestep_sinusoid(t)
        enabled = common.ENABLED
        try:
            common.ENABLED = False  # every launch through kernel[grid]: triton's own path
            plain = S.timestep_sinusoid(t)
        finally:
            common.ENABLED = enabled
        torch.cuda.synchronize()
        assert torch.equal(first, second) and torch.equal(third, plain) and torch.equal(first, plain), t.dtype
    entries = [e for k, e in common._READY.items() if k[0] is SK._sinusoid_kernel]
    assert entries and all(type(e[0]).__name__ == "builtin_function_or_method" for e in entries)
    recipes = [r for r in S._RECIPES.values() if r[3]]
    assert recipes and all(type(e[0]).__name__ == "builtin_function_or_method" and isinstance(e[3], int)
                           for r in recipes for e in r[3].values())


def test_cdiv_and_next_power_of_2_match_triton_s():
    import triton
    for n in range(0, 5000):
        assert common.next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 2, 3, 7, 16, 64, 1000):
            assert common.cdiv(n, d) == triton.cdiv(n, d)
    for n in (1 << 31, (1 << 31) + 1, (1 << 40) - 3):
        assert common.next_power_of_2(n) == triton.next_power_of_2(n) and common.cdiv(n, 48) == triton.cdiv(n, 48)
