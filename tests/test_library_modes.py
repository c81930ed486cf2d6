"""The vLLM, SGLang and Megatron-Core modes: unavailable with the real reason where the library is missing,
and, with a stand-in library that registers aten ops the way the real ones do (torch.library on the
process's dispatch key), switched on, checked active, switched off around the reference and back on."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from h3bench.harness.modes import MODES, ModeNotActive, library_modes as lm
from h3bench.harness.modes.base import dispatch_state


def test_the_rfc_modes_are_registered_in_its_order():
    assert list(MODES)[:7] == ["plain", "vllm", "sglang", "sglang_ieee", "megatron_te_native", "megatron_triton",
                               "megatron_triton_ieee"]
    assert MODES["vllm"].environment == {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"}
    assert MODES["sglang_ieee"].environment == MODES["megatron_triton_ieee"].environment == {
        "TRITON_F32_DEFAULT": "ieee"}
    assert MODES["megatron_te_native"].environment == {"CUBLASLT_WORKSPACE_SIZE": "0"}
    assert all(MODES[m].reference_with_mode_off for m in list(MODES)[1:7])


@pytest.mark.parametrize("mode,missing", [("vllm", "vllm"), ("sglang", "sglang"), ("megatron_triton", "megatron"),
                                          ("megatron_te_native", "megatron")])
def test_a_missing_library_raises_its_import_error(mode, missing):
    if lm._found(missing):
        pytest.skip(f"{missing} is installed here")
    with pytest.raises(ModuleNotFoundError, match=missing):
        MODES[mode].switch()


def test_vllm_replaces_gemms_only_on_ampere():
    assert "aten::mm" not in lm.vllm_expected((9, 0)) and "aten::bmm" in lm.vllm_expected((9, 0))
    assert {"aten::mm", "aten::addmm", "aten::linear"} <= set(lm.vllm_expected((8, 0)))


class FakeBatchInvariantLibrary:
    """Registers the given aten ops on this process's key, as sglang/megatron do; never computes."""

    def __init__(self, ops, key):
        self.ops, self.key, self.library, self.enabled = ops, key, None, False

    def enable_batch_invariant_mode(self, **kwargs):
        self.library = torch.library.Library("aten", "IMPL")
        for op in self.ops:
            self.library.impl(op.split("::")[1], lambda *a, **k: None, self.key)
        self.enabled = True

    def disable_batch_invariant_mode(self):
        self.library._destroy()
        self.library, self.enabled = None, False


@pytest.fixture
def fake_module(monkeypatch):
    def install(name, ops, signature=None):
        fake = FakeBatchInvariantLibrary(ops, lm._dispatch_key())
        module = types.ModuleType(name)
        module.enable_batch_invariant_mode = signature(fake) if signature else fake.enable_batch_invariant_mode
        module.disable_batch_invariant_mode = fake.disable_batch_invariant_mode
        monkeypatch.setitem(sys.modules, name, module)
        return fake, module
    return install


def test_sglang_mode_checked_active_and_switched_off_around_the_reference(fake_module):
    fake, _ = fake_module(lm.SGLANG_MODULE, lm.SGLANG_EXPECTED)
    active = MODES["sglang"].switch()
    try:
        found = active.check()
        assert found["replaced"] == sorted(lm.SGLANG_EXPECTED) and found["dispatch_key"] == lm._dispatch_key()
        with active.reference_off():
            assert not fake.enabled
            assert dispatch_state(["aten::mm"], lm._dispatch_key()) != {}
        assert fake.enabled
        assert active.check()["replaced"] == sorted(lm.SGLANG_EXPECTED)  # really back on
    finally:
        fake.disable_batch_invariant_mode()


def test_a_partly_active_mode_is_refused(fake_module):
    fake, _ = fake_module(lm.SGLANG_MODULE, ("aten::mm", "aten::addmm"))
    active = MODES["sglang"].switch()
    try:
        with pytest.raises(ModeNotActive, match="only partly active"):
            active.check()
    finally:
        fake.disable_batch_invariant_mode()


def test_megatron_released_versions_run_triton_and_refuse_te_native(fake_module, monkeypatch):
    monkeypatch.setattr(lm, "_found", lambda name: False)  # neither TE nor megatron.core's TE extension here

    def no_backend(fake):
        def enable_batch_invariant_mode():  # released 0.17-0.19.2: no argument
            fake.enable_batch_invariant_mode()
        return enable_batch_invariant_mode

    fake, module = fake_module(lm.MEGATRON_MODULE, lm.MEGATRON_EXPECTED, signature=no_backend)
    with pytest.raises(TypeError, match="has no backend='te_native'"):
        MODES["megatron_te_native"].switch()
    active = MODES["megatron_triton"].switch()
    try:
        assert active.check()["replaced"] == sorted(lm.MEGATRON_EXPECTED)
        assert active.record["switch"].endswith("enable_batch_invariant_mode()")
        assert active.record["patched"] and "no-op" in active.record["patched"][0]
        module._te_patch_for_batch_invariant()  # the documented no-op
    finally:
        fake.disable_batch_invariant_mode()


def test_megatron_with_a_backend_argument_passes_it(fake_module, monkeypatch):
    monkeypatch.setattr(lm, "_found", lambda name: True)
    seen = []

    def with_backend(fake):
        def enable_batch_invariant_mode(backend="triton"):
            seen.append(backend)
            fake.enable_batch_invariant_mode()
        return enable_batch_invariant_mode

    fake, _ = fake_module(lm.MEGATRON_MODULE, lm.MEGATRON_EXPECTED, signature=with_backend)
    active = MODES["megatron_triton"].switch()
    fake.disable_batch_invariant_mode()
    assert seen == ["triton"] and active.record["patched"] == []
