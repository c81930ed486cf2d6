"""The torch.compile rows (adapters/_torch_compile.py) of every op, and the quack_rms_norm row.

Dynamo's caches and the compile callbacks are process-wide: every test that compiles starts and ends with
`torch._dynamo.reset()` and the callbacks taken out (`fresh_dynamo`)."""
from __future__ import annotations

import dataclasses
import signal
import time

import pytest
import torch

from h3bench.adapters import builtin_adapters
from h3bench.adapters import _torch_compile as tc
from h3bench.harness import schema
from h3bench.harness.adapter import CompileTally, as_default_row
from h3bench.harness.config import load_config
from h3bench.harness.ops import OP_MODULES, get_op
from h3bench.harness.runner import RunRequest, run
from tests.helpers import CPU, CUDA, needs_cuda, nm_params, quick_config

ROWS = ("torch_compile", "torch_compile_max_autotune")


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    tc.HOOKS.uninstall()


def _quick_run(op: str, adapters, device: torch.device):
    config = quick_config(op)
    return run(RunRequest(config=config, device=device, adapters=adapters, modes=["plain"], out=None,
                          measure_bandwidth=False))


def test_every_op_has_both_compiled_rows_of_its_composition():
    """The RFC's ops compile their diffusers row, the common ops their torch row (Op.composition_row)."""
    for op in OP_MODULES:
        rows = {a.name: a for a in builtin_adapters(op)}
        base = rows[get_op(op).composition_row]
        for name in ROWS:
            assert name in rows, (op, name)
            assert rows[name].grads == base.grads and rows[name].reference == base.reference
            assert rows[name].cpu_only_when_named


def test_source_names_torch_the_mode_the_settings_and_the_composition(fresh_dynamo):
    params = nm_params()
    base = next(a for a in builtin_adapters("norm_modulate") if a.name == "diffusers").load(CPU, params)
    loaded = next(a for a in builtin_adapters("norm_modulate") if a.name == "torch_compile").load(CPU, params)
    assert loaded.source.startswith(f"torch {torch.__version__} torch.compile(automatic dynamic shapes) of "
                                    f"[{base.source}]")
    for setting in ("max_autotune=False", "coordinate_descent_tuning=False", "triton.cudagraphs=False",
                    "fallback_random=", "emulate_precision_casts=", "cpp.simdlen=", "cpp.threads=",
                    "automatic_dynamic_shapes=True", "assume_static_by_default=True"):
        assert setting in loaded.source, setting
    assert isinstance(loaded.compile_tally, CompileTally) and loaded.compile_tally.compiles == 0
    # the mode's own options, as Inductor applies them; no C++ settings for a GPU
    autotuned = tc.describe_settings(tc.MAX_AUTOTUNE, CUDA)
    assert "max_autotune=True" in autotuned and "coordinate_descent_tuning=True" in autotuned
    assert "triton.cudagraphs=False" in autotuned and "cpp." not in autotuned


def test_on_a_cpu_max_autotune_says_why_and_both_rows_leave_the_default_rows():
    params = nm_params()
    rows = {a.name: a for a in builtin_adapters("norm_modulate")}
    reason = rows["torch_compile_max_autotune"].try_load(CPU, params)
    assert reason == f"skipped on CPU: {tc.MAX_AUTOTUNE_ON_CPU}" and "\n" not in reason
    for name in ROWS:   # a deliberate skip, worded as one: no exception type
        default = as_default_row(rows[name], CPU).try_load(CPU, params)
        assert isinstance(default, str) and default.startswith("skipped on CPU: ") and "Error" not in default
        assert default.endswith(f"name it with --adapters {name} to run it")
        assert as_default_row(rows[name], CUDA) is rows[name]
    assert as_default_row(rows["diffusers"], CPU) is rows["diffusers"]


def test_quick_run_of_timestep_sinusoid_compiled_matches_diffusers(fresh_dynamo, device):
    rows = {a.name: a for a in builtin_adapters("timestep_sinusoid")}
    evidence = _quick_run("timestep_sinusoid", [rows["diffusers"], rows["torch_compile"]], device)
    plain = evidence.results["plain"]
    eager, compiled = plain["diffusers"], plain["torch_compile"]
    assert isinstance(compiled, schema.RowResult), compiled
    assert compiled.compile_s > 0 and compiled.compiles >= 1 and eager.compile_s is None
    assert compiled.accuracy_latency.keys() == eager.accuracy_latency.keys()
    for size, result in compiled.accuracy_latency.items():
        # fp32 sin/cos of the same products: Inductor may fuse and vectorise, not lose precision
        assert result.fwd_rel_err <= max(4 * eager.accuracy_latency[size].fwd_rel_err, 1e-6), size
    data = schema.to_dict(evidence)
    assert data["results"]["plain"]["torch_compile"]["compiles"] == compiled.compiles
    assert "compile_s" not in data["results"]["plain"]["diffusers"]
    assert schema.to_dict(schema.from_json(data)) == data
    from h3bench.reports.table import render_markdown
    text = render_markdown(evidence)
    assert "### Compile time" in text and f"| torch_compile | measured | {compiled.compile_s:.1f} |" in text


def test_a_spent_compile_budget_stops_the_compile_and_says_why(fresh_dynamo, device):
    base = next(a for a in builtin_adapters("timestep_sinusoid") if a.name == "diffusers")
    row = dataclasses.replace(base, name="tiny_budget", load=tc.compiled_load(base, tc.DEFAULT, budget_s=1e-3))
    found = _quick_run("timestep_sinusoid", [row], device).results["plain"]["tiny_budget"]
    assert isinstance(found, schema.UnavailableRow), found
    assert found.unavailable.startswith("CompileBudgetExceeded: torch.compile(mode='default') spent ")
    assert "past its budget of 0.001 s" in found.unavailable and found.compile_s > 0
    assert found.failed_probe == "all_rows"
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL  # the timer's handler put back
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_row_without_a_budget_of_its_own_is_held_to_its_plans(fresh_dynamo, device):
    """The run sets the plan's [compile] budget for the row's mode before its first call: a tiny one stops
    the default-mode row, named with that budget; the row's source says where its budget comes from."""
    import dataclasses as dc
    base = next(a for a in builtin_adapters("timestep_sinusoid") if a.name == "diffusers")
    row = dc.replace(base, name="plan_budget", load=tc.compiled_load(base, tc.DEFAULT))
    config = quick_config("timestep_sinusoid")
    config = dc.replace(config, compile=dc.replace(config.compile, default_budget_s=1e-3))
    found = run(RunRequest(config=config, device=device, adapters=[row], modes=["plain"], out=None,
                           measure_bandwidth=False)).results["plain"]["plan_budget"]
    assert isinstance(found, schema.UnavailableRow), found
    assert "past its budget of 0.001 s" in found.unavailable
    assert "compile budget the run plan's [compile] table's" in found.source


def test_the_shipped_plans_give_every_compile_mode_a_budget_and_the_full_plans_max_autotune_the_defaults():
    """max-autotune's verdict is what a user of that mode comes for: the full plans let it compile as long as
    the default mode; the quick plan bounds it."""
    from h3bench.harness.config import load_config
    for op in OP_MODULES:
        full, quick = load_config(op), load_config(op, quick=True)
        assert full.compile.budget_s(tc.MAX_AUTOTUNE) == full.compile.budget_s(tc.DEFAULT) > 0, op
        assert 0 < quick.compile.budget_s(tc.MAX_AUTOTUNE) <= full.compile.budget_s(tc.MAX_AUTOTUNE), op
    assert load_config("gate_residual", overrides=("compile.max_autotune_budget_s=45",)).compile.budget_s(
        tc.MAX_AUTOTUNE) == 45.0


def _swallowing_compile(stopped: list):
    """A stand-in for torch.compile whose compilation, as Inductor's per-choice autotuning compile does,
    catches every Exception and carries on; it ends only when something it cannot catch stops it (then
    `stopped` gets True), or after a minute (a hang, for the test to fail on)."""
    def compile_(fn, **_kw):
        def compiled(*args):
            tc.HOOKS._on_start(None)
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    try:
                        time.sleep(0.005)
                    except Exception:  # "Triton compilation failed", and on to the next choice
                        pass
            except BaseException:
                stopped.append(True)
                raise
            finally:
                tc.HOOKS._on_end(None)
            return fn(*args)
        return compiled
    return compile_


def test_the_budget_stops_a_compilation_that_catches_every_exception(fresh_dynamo, monkeypatch):
    base = next(a for a in builtin_adapters("timestep_sinusoid") if a.name == "diffusers")
    params = load_config("timestep_sinusoid", quick=True).inputs
    stopped: list = []
    monkeypatch.setattr(torch, "compile", _swallowing_compile(stopped))
    loaded = tc.compiled_load(base, tc.DEFAULT, budget_s=0.2)(CPU, params)
    case = get_op("timestep_sinusoid").make_inputs(params, 4, seed=3, device=CPU)
    with pytest.raises(tc.CompileBudgetExceeded, match=r"spent \d+\.\d s compiling, past its budget of 0\.2 s"):
        loaded.fn(*case.tensors.values())
    assert stopped == [True]  # the timer stopped it inside the compilation, not the minute running out
    assert loaded.compile_tally.overrun is not None and tc.HOOKS.calling is None
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL


def test_the_timer_is_not_armed_outside_the_rows_own_call(fresh_dynamo):
    """A compilation outside the row's call (a lazily compiled backward on the main thread of a CPU run) is
    checked as it ends: a BaseException there would pass the harness's blame."""
    hooks = tc._Hooks()
    hooks.current = tc._RowCompile(tc.DEFAULT, budget_s=0.05)
    hooks._on_start(None)
    try:
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        time.sleep(0.1)
    finally:
        hooks._on_end(None)
    assert hooks.current.tally.overrun is not None  # found over its budget as it ended


def test_a_compilation_lets_a_waiting_measurement_in_before_it_starts(monkeypatch):
    """A compilation is one step of a probe that may last the whole budget: a measurement another run waits
    for goes first (harness/gpu_turns.py), and its wait is not counted as compile time."""
    from h3bench.harness import gpu_turns
    hooks = tc._Hooks()
    hooks.current = row = tc._RowCompile(tc.DEFAULT, budget_s=None)
    let_in: list[float] = []

    def measurement_let_in() -> None:
        time.sleep(0.05)  # the measurement's turn: this wait must not count
        let_in.append(time.perf_counter())
    monkeypatch.setattr(gpu_turns, "let_measurement_in", measurement_let_in)
    hooks._on_start(None)
    hooks._on_end(None)
    ended = time.perf_counter()
    assert len(let_in) == 1 and row.tally.compiles == 1
    assert row.tally.seconds <= ended - let_in[0]  # counted from after the measurement, never before


def test_without_a_timer_the_budget_is_checked_as_each_compilation_ends():
    row = tc._RowCompile(tc.MAX_AUTOTUNE, budget_s=10.0)
    row.spend(6.0)
    assert row.tally.overrun is None and row.tally.compiles == 1
    row.spend(6.0)
    assert row.tally.overrun == ("CompileBudgetExceeded: torch.compile(mode='max-autotune-no-cudagraphs') spent "
                                 "12.0 s compiling, past its budget of 10 s (2 compilation(s) finished)")
    hooks = tc._Hooks()
    hooks.current = row
    with pytest.raises(tc.CompileBudgetExceeded, match="past its budget"):  # no further compilation
        hooks._on_start(None)


# --- quack_rms_norm ---------------------------------------------------------------------------------------

def _quack():
    return next(a for a in builtin_adapters("norm_modulate") if a.name == "quack_rms_norm")


def test_quack_row_is_the_norm_alone_and_unavailable_on_cpu():
    row = _quack()
    assert row.grads == ("x", "w") and row.reference == "rms_norm"
    assert row.try_load(CPU, nm_params()) == "RuntimeError: needs CUDA (CuTe DSL kernel), got device cpu"


@needs_cuda("needs CUDA: Quack's rmsnorm is a CuTe DSL kernel")
def test_quack_matches_torch_rms_norm_within_bf16_tolerance():
    import importlib.util

    from h3bench.adapters._sglang_import import ensure_cutlass_dsl_on_path
    ensure_cutlass_dsl_on_path()
    if importlib.util.find_spec("quack") is None:
        pytest.skip("quack-kernels is not installed (tools/pack_devpkgs.sh carries it)")
    from tests.helpers import against_reference
    from h3bench.harness.ops import get_op

    op, config = get_op("norm_modulate"), load_config("norm_modulate", quick=True)
    params = dataclasses.replace(config.inputs, hidden=5376)
    torch_row = next(a for a in builtin_adapters("norm_modulate") if a.name == "torch_rms_norm")
    results = {}
    for row in (_quack(), torch_row):
        inputs, grad_outs, out, _ = against_reference(op, config, row.load(CUDA, params).fn, row.grads, 130,
                                                      params=params, device=CUDA)
        results[row.name] = out
    quack, eager = results["quack_rms_norm"], results["torch_rms_norm"]
    torch.testing.assert_close(quack.outputs[0], eager.outputs[0], rtol=1.6e-2, atol=1.6e-2)
    for name in ("x", "w"):
        scale = eager.grads[name].float().abs().max().item()
        torch.testing.assert_close(quack.grads[name].float(), eager.grads[name].float(), rtol=1.6e-2,
                                   atol=1.6e-2 * scale)


def test_the_hooks_raise_dynamos_recompile_limit_and_put_it_back():
    """The probes call a compiled row with more guard sets than Dynamo's default limit of 8 (past it the rest
    would run eagerly and count as differences): installing the hooks raises it, uninstalling restores it."""
    import torch._dynamo.config as dynamo_config

    tc.HOOKS.uninstall()
    before = dynamo_config.recompile_limit
    try:
        tc.HOOKS.install()
        assert dynamo_config.recompile_limit == max(before, tc.RECOMPILE_LIMIT) > 8
        tc.HOOKS.install()  # a second row's load: the value to restore stays the one found
    finally:
        tc.HOOKS.uninstall()
    assert dynamo_config.recompile_limit == before
