"""Blame the right party: only an exception from inside the implementation's own call (forward,
backward, its load) or a result breaking the op's contract becomes that row's "unavailable" reason; a
bug in a probe, a reference or the schema code stops the run with its traceback, and writes nothing."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from h3bench.harness import schema
from h3bench.harness.adapter import from_function
from h3bench.harness.config import load_config
from h3bench.harness.ops import get_op
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import RowResult, UnavailableRow
from tests.helpers import composition

CPU = torch.device("cpu")
GRADS = ("x", "w", "sh", "sc")
QUICK = load_config("norm_modulate", quick=True)
CONFIG = dataclasses.replace(QUICK, timing=dataclasses.replace(QUICK.timing, repeats=1))


def request(*fns, out=None) -> RunRequest:
    adapters = [from_function(fn, name=fn.__name__, op="norm_modulate", differentiable=GRADS) for fn in fns]
    return RunRequest(config=CONFIG, device=CPU, adapters=adapters, modes=["plain"], out=out,
                      measure_bandwidth=False)


def honest(x, w, sh, sc, idx):
    return composition(x, w, sh, sc, idx)


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("planted failure in the implementation's backward")


def fails_in_backward(x, w, sh, sc, idx):
    return composition(_FailingBackward.apply(x), w, sh, sc, idx)


def wrong_shape(x, w, sh, sc, idx):
    return composition(x, w, sh, sc, idx)[:, :-1]


def returns_float32(x, w, sh, sc, idx):
    """bf16 inputs, a float32 result: more accurate than any bf16 row could be, and not the op's output."""
    return composition(x.float(), w.float(), sh.float(), sc.float(), idx)


def returns_a_list_of_two(x, w, sh, sc, idx):
    y = composition(x, w, sh, sc, idx)
    return [y, y]


_CALLS = {"n": 0}


def fails_only_while_timed(x, w, sh, sc, idx):
    """Correct through every probe; raises on the first call of the latency phase."""
    if _CALLS.get("timing") and not torch.is_grad_enabled():
        raise RuntimeError("planted failure while timed")
    return composition(x, w, sh, sc, idx)


@pytest.mark.parametrize("fn,probe,reason", [
    (fails_in_backward, "all_rows", "RuntimeError: planted failure in the implementation's backward"),
    (wrong_shape, "all_rows", "contract: output 'y' has shape (3, 63), the op's is (3, 64)"),
    (returns_float32, "all_rows", "contract: output 'y' has dtype torch.float32, the op's is torch.bfloat16"),
    (returns_a_list_of_two, "all_rows", "implementation returned 2 tensors, the op has 1 outputs"),
])
def test_implementation_failures_are_its_rows_reason(fn, probe, reason):
    rows = run(request(fn, honest)).results["plain"]
    bad = rows[fn.__name__]
    assert isinstance(bad, UnavailableRow)
    assert (bad.unavailable, bad.failed_probe) == (reason, probe)
    assert isinstance(rows["honest"], RowResult) and rows["honest"].batch_invariance.batch_invariant


def test_failure_in_the_latency_phase_is_the_rows_reason(monkeypatch):
    from h3bench.harness.probes import accuracy_latency as acc

    original = acc.time_rows

    def mark_timing(*args, **kwargs):
        _CALLS["timing"] = True
        try:
            return original(*args, **kwargs)
        finally:
            _CALLS["timing"] = False

    monkeypatch.setattr(acc, "time_rows", mark_timing)
    rows = run(request(fails_only_while_timed, honest)).results["plain"]
    bad = rows["fails_only_while_timed"]
    assert isinstance(bad, UnavailableRow)
    assert (bad.unavailable, bad.failed_probe) == ("RuntimeError: planted failure while timed", "accuracy_latency")
    good = rows["honest"]
    assert isinstance(good, RowResult) and good.accuracy_latency["130"].fwd_us > 0


def test_a_bug_in_the_reference_stops_the_run_and_writes_nothing(monkeypatch, tmp_path):
    op = get_op("norm_modulate")

    def broken_reference(*args, **kwargs):
        raise KeyError("planted harness bug in the reference")

    monkeypatch.setattr(type(op), "reference", broken_reference)
    out = tmp_path / "e.json"
    with pytest.raises(KeyError, match="planted harness bug"):
        run(request(honest, out=out))
    assert not out.exists()


def test_a_bug_in_a_probe_stops_the_run(monkeypatch):
    from h3bench.harness.probes import batch_invariance as bi

    def broken_sweep(ctx, plan):
        raise IndexError("planted harness bug in the sweep")

    monkeypatch.setattr(bi, "BATCH_SIZE_SWEEP", dataclasses.replace(bi.BATCH_SIZE_SWEEP, run=broken_sweep))
    with pytest.raises(IndexError, match="planted harness bug"):
        run(request(honest))


def test_a_bug_in_the_schema_code_stops_the_run(monkeypatch, tmp_path):
    def broken_dumps(evidence):
        raise TypeError("planted harness bug in the codec")

    monkeypatch.setattr(schema, "dumps", broken_dumps)
    out = tmp_path / "e.json"
    with pytest.raises(TypeError, match="planted harness bug"):
        run(request(honest, out=out))
    assert not out.exists()


def test_the_cli_exits_non_zero_with_the_traceback_and_writes_nothing(invoke, tmp_path, monkeypatch):
    from h3bench.harness.probes import batch_invariance as bi

    def broken_all_rows(ctx, plan, *more):
        raise ZeroDivisionError("planted harness bug in all_rows")

    monkeypatch.setattr(bi, "all_rows", broken_all_rows)
    out = tmp_path / "e.json"
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm", "--set",
                          "hidden=16", "--out", str(out))
    assert result.exit_code != 0
    assert isinstance(result.exception, ZeroDivisionError)  # the harness's own error, not a row's verdict
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_asynchronous_fault_is_raised_inside_the_implementations_block(monkeypatch):
    """A GPU kernel's fault (an illegal address) surfaces at the next synchronisation; the harness
    synchronises inside the implementation's block (after each call, or where a bitwise probe waits
    before it reads back), so the fault is the row's, not the harness's.
    Stand-in for the GPU: the synchronisation raises as CUDA's would after a faulting kernel."""
    from h3bench.harness import execute

    def faulting_settle(tensors):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(execute, "settle", faulting_settle)
    evidence = run(request(honest))
    row = evidence.results["plain"]["honest"]
    assert isinstance(row, UnavailableRow) and "illegal memory access" in row.unavailable
    assert row.failed_probe == "all_rows"


def test_a_row_that_kills_the_device_stops_the_run_naming_it(monkeypatch, tmp_path):
    """After a sticky CUDA fault every later row would fail with the same error and be recorded as
    failing by itself; the run stops instead, naming the row that faulted, and writes nothing."""
    import h3bench.harness.runner as runner
    monkeypatch.setattr(runner, "device_usable", lambda device: False)
    out = tmp_path / "e.json"
    with pytest.raises(runner.DeviceLost, match="row 'fails_in_backward'"):
        run(request(fails_in_backward, honest, out=out))
    assert not out.exists()


def test_a_fault_met_at_the_harnesss_next_launch_stops_the_run_naming_the_row(monkeypatch, tmp_path):
    """The bitwise probes leave a row's kernels queued, so a fault the device reports before the probe's
    wait surfaces at the next launch, which may be the harness's: with the CUDA context unusable after it,
    the row's queued kernels are the cause and the run stops naming the row and the probe; with the
    context working, the same error is the harness's own and propagates as it is."""
    import h3bench.harness.runner as runner
    from h3bench.harness.probes import batch_invariance as bi

    def faulting_cat(outcomes):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(bi, "_cat_outputs", faulting_cat)
    with pytest.raises(RuntimeError, match="illegal memory access") as raised:
        run(request(honest))
    assert not isinstance(raised.value, runner.DeviceLost)
    monkeypatch.setattr(runner, "device_usable", lambda device: False)
    out = tmp_path / "e.json"
    with pytest.raises(runner.DeviceLost, match="row 'honest' .* in its all_rows probe: .*illegal memory access"):
        run(request(honest, out=out))
    assert not out.exists()
