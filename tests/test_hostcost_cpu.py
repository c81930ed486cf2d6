"""tools/hostcost_cpu.py stubs every launcher, so its figures are the host path and not the interpreter's
kernels."""
import sys

import pytest
import torch

from h3bench.kernels import common
from tests.helpers import needs_interpreter
from tools import hostcost_cpu


def test_stub_replaces_every_launcher_binding_and_restore_puts_them_back():
    import h3bench.kernels.final_adaln_out_kernel  # noqa: F401  (the modules whose bindings are checked must be loaded)
    import h3bench.kernels.norm_modulate_kernel  # noqa: F401
    import h3bench.kernels.timestep_sinusoid_api  # noqa: F401

    launchers = hostcost_cpu.launchers()
    assert {common.launch, common.launch_keyed, common.launch_ready} <= launchers

    def bound():
        return [(name, attr) for name, module in list(sys.modules.items())
                if module is not None and (name == "h3bench.kernels" or name.startswith("h3bench.kernels."))
                for attr, value in list(vars(module).items()) if callable(value) and value in launchers]

    before = bound()
    assert ("h3bench.kernels.norm_modulate_kernel", "launch_keyed") in before
    restore = hostcost_cpu.stub_launches()
    try:
        assert bound() == []
    finally:
        restore()
    assert bound() == before


@needs_interpreter("tools/hostcost_cpu.py measures the host path on a CPU-only machine")
def test_stubbed_calls_reach_no_kernel(monkeypatch):
    """A fwd+bwd of each case with the launches stubbed never indexes a kernel (`kernel[grid]`, which the
    interpreter would run); the control, without the stub, does."""
    from h3bench.kernels import final_adaln_out_kernel as final_adaln_out, gemm, norm_modulate_kernel as norm_modulate

    def boom(self, grid):
        raise AssertionError(f"a kernel was launched: {self}")

    kinds = {type(v) for m in (norm_modulate, gemm, final_adaln_out) for v in vars(m).values()
             if type(v).__name__ in ("JITFunction", "InterpretedFunction")}
    assert kinds
    for kind in kinds:
        monkeypatch.setattr(kind, "__getitem__", boom)
    cases = [hostcost_cpu.norm_modulate_case(8, 64, 9, torch.bfloat16, False),
             hostcost_cpu.final_adaln_out_case(8, 64, 9, torch.bfloat16, False)]
    restore = hostcost_cpu.stub_launches()
    try:
        for steps in cases:
            for step in steps.values():
                step()
    finally:
        restore()
    with pytest.raises(AssertionError, match="a kernel was launched"):
        cases[0]["fwd"]()


def test_hostcost_breakdown_times_pieces_that_exist():
    """tools/hostcost.py's in-place breakdown (a GPU tool) wraps attributes by name: a renamed one
    must fail here, not on the GPU."""
    from tools import hostcost

    pieces = hostcost.breakdown_pieces()
    missing = [(getattr(owner, "__name__", owner), name) for owner, name, _ in pieces if not hasattr(owner, name)]
    assert not missing
    assert any(name == "launch_keyed" for _, name, _ in pieces)


def test_no_module_defines_a_top_level_name_twice():
    """A second `def` of a name silently replaces the first (an edit that pasted a module into itself
    once left tools/hostcost.py running an old `breakdown` past the fixed one)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    twice = []
    for folder in ("harness", "kernels", "tools", "adapters", "reports"):
        for path in sorted((root / folder).rglob("*.py")):
            seen = set()
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    if node.name in seen:
                        twice.append(f"{path.relative_to(root)}: {node.name}")
                    seen.add(node.name)
    assert not twice
