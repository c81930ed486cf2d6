"""conftest's guard: each kind of change a test could leave behind is seen (each test here makes one,
checks that `_changes` names it, and undoes it before the guard's own check runs)."""
import os

import pytest
import torch

from tests.conftest import _changes, _process_state


def test_an_environment_variable_set_is_seen(monkeypatch):
    before = _process_state()
    monkeypatch.setenv("TRITON_INTERPRET", "0" if os.environ.get("TRITON_INTERPRET") == "1" else "1")
    assert _changes(before, _process_state()) == ["os.environ: TRITON_INTERPRET"]


def test_a_patched_interpreter_function_is_seen(monkeypatch):
    interpreter = pytest.importorskip("triton.runtime.interpreter")
    before = _process_state()
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", lambda *a: None)
    assert _changes(before, _process_state()) == ["interpreter.InterpreterBuilder: create_dot"]


def test_torch_switches_are_seen():
    before = _process_state()
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert _changes(before, _process_state()) == [
            f"torch.get_num_threads(): {threads} -> {threads + 1}"]
    finally:
        torch.set_num_threads(threads)
    assert _changes(before, _process_state()) == []
