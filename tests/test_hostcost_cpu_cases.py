"""Every case of tools/hostcost_cpu.py, eager and through the custom ops (`--custom-ops`), runs with its
launches stubbed and no kernel: its figures are the host path."""
import pytest
import torch

from h3bench.kernels import gemm, timestep_mlp_kernel
from tests.helpers import needs_interpreter
from tools import hostcost_cpu


def _cases(traced: bool) -> dict:
    bf16 = torch.bfloat16
    cases = {op: make(8, 32, 9, bf16, False, traced=traced) for op, make in hostcost_cpu.ROW_CASES.items()}
    cases["adaln_projection"] = hostcost_cpu.adaln_projection_case(4, 32, bf16, traced=traced)
    cases["timestep_mlp"] = hostcost_cpu.timestep_mlp_case(4, 32, traced=traced)
    cases["timestep_sinusoid"] = hostcost_cpu.timestep_sinusoid_case(4, 64, traced=traced)
    return cases


@needs_interpreter("tools/hostcost_cpu.py measures the host path on a CPU-only machine")
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "custom ops"])
def test_every_case_runs_every_step_without_a_kernel(monkeypatch, traced):
    for op in hostcost_cpu.OPS:   # every launcher's module imported, as main() does, so the stub sees them all
        __import__(f"h3bench.kernels.{op}_api")
    monkeypatch.setattr(timestep_mlp_kernel, "configs", timestep_mlp_kernel.configs)  # the case sets the GPU's

    def boom(self, grid):
        raise AssertionError(f"a kernel was launched: {self}")

    kind = type(gemm._gemm_kernel)
    assert kind.__name__ in ("JITFunction", "InterpretedFunction")
    monkeypatch.setattr(kind, "__getitem__", boom)
    cases = _cases(traced)
    assert set(cases) == set(hostcost_cpu.OPS)
    restore = hostcost_cpu.stub_launches()
    try:
        for steps in cases.values():
            for step in steps.values():
                step()
    finally:
        restore()
