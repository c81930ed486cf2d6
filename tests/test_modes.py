"""Global modes in child processes: a mode really patching an aten op, a switch that does nothing, a
library that does not import, a child that crashes, a child that hangs past its timeout, and the merge
of the parts into one evidence file (every other mode survives each failure)."""
from __future__ import annotations

import pytest
import torch

from h3bench.harness import modes, schema
from h3bench.harness.modes.base import ModeNotActive, dispatch_state, replaced_ops, require_replaced
from h3bench.harness.schema import RowResult, UnavailableMode



def run_modes(invoke, tmp_path, *names, timeout="60"):
    out = tmp_path / "modes.json"
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm", "--set", "hidden=16",
                          "--set", "timing.repeats=1", "--mode", ",".join(names), "--mode-timeout", timeout,
                          "--no-render", "--quiet", "--out", str(out))
    assert result.exit_code == 0, text + repr(result.exception)
    return schema.load(out)


def test_parse_modes():
    assert modes.parse_modes(["plain,deterministic", "plain"]) == ["plain", "deterministic"]
    assert modes.parse_modes(["all"]) == list(modes.MODES)
    with pytest.raises(ValueError, match="unknown mode"):
        modes.parse_modes(["plain,fast"])
    with pytest.raises(ValueError, match="no mode"):
        modes.parse_modes([" , "])


def test_dispatch_state_sees_a_cpu_override():
    before = dispatch_state(["aten::rsqrt", "aten::mm"], key="CPU")
    library = torch.library.Library("aten", "IMPL")
    library.impl("rsqrt", lambda x: torch.reciprocal(torch.sqrt(x)), "CPU")
    try:
        assert replaced_ops(before, dispatch_state(["aten::rsqrt"], key="CPU")) == ["aten::rsqrt"]
        assert require_replaced("m", before, ["aten::rsqrt", "aten::mm"], key="CPU") == ["aten::rsqrt"]
    finally:
        del library
    with pytest.raises(ModeNotActive, match="not active"):
        require_replaced("m", dispatch_state(["aten::mm"], key="CPU"), ["aten::mm"], key="CPU")


def test_deterministic_and_fake_modes_run_in_children_and_merge(invoke, tmp_path, fake_modes):
    evidence = run_modes(invoke, tmp_path, "plain", "deterministic", "fake_aten")
    assert list(evidence.results) == ["plain", "deterministic", "fake_aten"]
    assert list(evidence.environment.mode_environment) == ["plain", "deterministic", "fake_aten"]
    for mode in evidence.results:
        row = evidence.results[mode]["torch_rms_norm"]
        assert isinstance(row, RowResult) and row.batch_invariance.batch_invariant, mode
    env = evidence.environment.mode_environment
    assert env["plain"] == {}
    assert env["deterministic"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["deterministic"]["active"] == {"torch.are_deterministic_algorithms_enabled": True}
    # the child saw its variable from the start, and its aten op was really replaced before rows ran
    assert env["fake_aten"]["active"] == {"replaced": ["aten::rsqrt"], "variable": "set-before-start"}
    assert env["fake_aten"]["H3BENCH_FAKE_MODE_VARIABLE"] == "set-before-start"
    assert env["fake_aten"]["libraries"] == {"torch": torch.__version__.split("+")[0]}
    assert not torch.are_deterministic_algorithms_enabled()  # the parent never switched a mode on


def test_failing_modes_are_unavailable_and_the_others_survive(invoke, tmp_path, fake_modes):
    evidence = run_modes(invoke, tmp_path, "fake_inactive", "plain", "fake_unimportable", "fake_crash",
                         "fake_aten", "fake_hang", timeout="25")
    assert list(evidence.results) == ["fake_inactive", "plain", "fake_unimportable", "fake_crash", "fake_aten",
                                      "fake_hang"]
    results = evidence.results
    assert isinstance(results["plain"]["torch_rms_norm"], RowResult)
    assert isinstance(results["fake_aten"]["torch_rms_norm"], RowResult)
    assert results["fake_inactive"] == UnavailableMode(
        "ModeNotActive: mode fake_inactive is not active: none of aten::rsqrt has a new CPU kernel")
    assert results["fake_unimportable"] == UnavailableMode(
        "ModuleNotFoundError: No module named 'no_such_batch_invariant_library'")
    assert isinstance(results["fake_crash"], UnavailableMode)
    assert "exited with status 3" in results["fake_crash"].unavailable
    assert isinstance(results["fake_hang"], UnavailableMode)
    assert "timed out after 25" in results["fake_hang"].unavailable
    # every mode has its environment record, also the ones whose child never wrote a part
    assert set(evidence.environment.mode_environment) == set(results)
    again = schema.from_json(schema.to_dict(evidence))  # an unavailable mode round-trips through the contract
    assert again.results["fake_crash"] == results["fake_crash"]
