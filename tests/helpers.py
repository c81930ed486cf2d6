"""Shared bits of the CPU tests: the vendored prior-art file, the honest composition, and what the op and
kernel tests of every op do alike (float64 bounds, the reference's finite differences, faults planted on
even batches, the rl-kernel rows' fake rl_engine, quick plans through the runner and their verdicts)."""
from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# The RFC's evidence file (our output contract), vendored once: tests/data/README.md says where it came from.
PRIOR_ART = REPO / "tests" / "data" / "norm_modulate_b200.json"


def needs_cuda(reason: str):
    """Skip, with `reason`, where there is no CUDA device; marked `gpu`, so the GPU suite selects it
    (tests/conftest.py: under H3BENCH_TEST_DEVICE=cuda only `gpu` tests and the device-parametrised ones run)."""
    def mark(test):
        return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason=reason)(test))
    return mark


def needs_interpreter(reason: str):
    """Skip, with `reason`, where Triton runs compiled (the GPU suite): the test runs our kernels on CPU
    tensors, which only the interpreter does."""
    from h3bench.kernels.common import interpreter_active
    return pytest.mark.skipif(not interpreter_active(), reason=f"needs the Triton interpreter: {reason}")


def require_prior_art() -> Path:
    """The vendored prior-art file; a clone without it is broken, so this fails rather than skips."""
    assert PRIOR_ART.is_file(), f"the vendored prior-art file is missing: {PRIOR_ART}"
    return PRIOR_ART


def nm_params(hidden: int = 64, dtype: str = "bfloat16", **changes):
    """norm_modulate's parameters at the default config's constants, with `hidden` and `dtype` set."""
    import dataclasses

    from h3bench.harness.config import load_config

    base = load_config("norm_modulate").inputs
    return dataclasses.replace(base, hidden=hidden, dtype=dtype, **changes)


def composition(x, w, sh, sc, idx):
    """The op as diffusers composes it: F.rms_norm, then index_select modulation."""
    y = F.rms_norm(x, (x.shape[-1],), w, 1e-5)
    return y * (1 + sc.index_select(0, idx)) + sh.index_select(0, idx)


def even(t: torch.Tensor) -> bool:
    return t.shape[0] % 2 == 0


# The RFC's counts per plan set (docs/probes.md), written out.
RFC_ALL_ROWS = {"64": 192, "257": 771, "2048": 6144}
RFC_SUB_BATCHES = {"token": 2124, "timestep": 2060, "sinusoid": 2060}
RFC_FULL_BATCH = {"token": 131072, "timestep": 4096, "sinusoid": 8192}
RFC_COMPARISONS = 2256


def run_default_plan_counts(op_name: str, overrides: tuple[str, ...], adapter):
    """The op's default probe plan (all_rows, full_vs_sub_batches, batch_size_sweep) run in full on the
    CPU at the tiny sizes `overrides` sets, through `adapter`; asserts the RFC's counts for the op's plan
    set and returns the verdict for the caller's own checks."""
    from h3bench.harness.config import load_config
    from h3bench.harness.ops import get_op
    from h3bench.harness.probes import batch_invariance as bi
    from h3bench.harness.probes.context import ProbeContext

    config = load_config(op_name, overrides=overrides)
    op, cpu = get_op(op_name), torch.device("cpu")
    assert config.quick is False and config.plans == op.plan_set
    ctx = ProbeContext(op=op, params=config.inputs, fn=adapter.load(cpu, config.inputs).fn, grads=adapter.grads,
                       device=cpu, reference_variant=adapter.reference or op.name)
    cases, repeatable = bi.all_rows(ctx, config.all_rows)
    subs = bi.full_vs_sub_batches(ctx, config.full_vs_sub)
    sweep = bi.batch_size_sweep(ctx, config.sweep)
    found = bi.verdict(cases, repeatable, subs, sweep)
    assert {k: c.rows for k, c in found.all_rows.items()} == RFC_ALL_ROWS
    assert subs.full_batch == RFC_FULL_BATCH[op.plan_set]
    assert subs.sub_batches == RFC_SUB_BATCHES[op.plan_set] == bi.sub_batches_total(config.full_vs_sub)
    assert sweep.comparisons == RFC_COMPARISONS == bi.sweep_total(config.sweep)
    return found


@pytest.fixture
def one_thread():
    """A fixture (import it into the test module) for the full default plans: they run thousands of tiny
    calls, and on a small, busy CI machine OpenMP's thread handoffs cost far more than the work (the sweep
    took 25 s on 2 threads, 0.9 s on one). Same counts either way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- float64 bounds ---------------------------------------------------------------------------------------

def within(got: torch.Tensor, ref: torch.Tensor, bound) -> bool:
    """Every element of `got` within `bound` (per element, broadcast, or one number) of the float64 `ref`."""
    return bool(((got.double() - ref).abs() <= bound).all())


def assert_reference_grads_match_finite_differences(op, params, rows: int = 3) -> None:
    """The op's reference as a black box, for an op whose every input is differentiable and which has one
    output: d/de sum(out(p + e v) * dy) at e = 0, by central differences in float64, equals the sum over
    the inputs of <grad, v> for one random direction v through all of them."""
    names = op.input_names
    base = {n: t.double() for n, t in op.make_inputs(params, rows, 3, CPU).tensors.items()}
    (dy,) = op.make_grad_outs(params, rows, 9, CPU)
    gen = torch.Generator().manual_seed(1)
    direction = {n: torch.randn(t.shape, generator=gen, dtype=torch.float64) for n, t in base.items()}
    grads = op.reference(params, op.bundle(base), (dy,), names, op.name).grads

    def loss(e: float) -> float:
        moved = op.bundle({n: base[n] + e * direction[n] for n in names})
        return (op.reference(params, moved, None, (), op.name).outputs[0] * dy.double()).sum().item()

    eps = 1e-6
    numeric = (loss(eps) - loss(-eps)) / (2 * eps)
    analytic = sum((grads[n] * direction[n]).sum().item() for n in names)
    assert numeric == pytest.approx(analytic, rel=1e-7, abs=1e-9)


def against_reference(op, config, fn, grads: tuple[str, ...], rows: int, params=None, device=CPU):
    """The accuracy probe's steps by hand: the op's inputs and upstream gradients at the config's accuracy
    seeds (and its params unless `params`), `fn` run through harness.execute with `grads`, and the float64
    reference of the same gradients. Returns (inputs, grad_outs, outcome, reference)."""
    from h3bench.harness.execute import execute

    params = config.inputs if params is None else params
    inputs = op.make_inputs(params, rows, config.accuracy.input_seed, device)
    grad_outs = op.make_grad_outs(params, rows, config.accuracy.grad_seed, device)
    out = execute(fn, inputs, grad_outs, grads, len(op.outputs))
    return inputs, grad_outs, out, op.reference(params, inputs, grad_outs, grads, op.name)


# --- faults planted on even batches ------------------------------------------------------------------------

class GradBumpOnEvenBatches(torch.autograd.Function):
    """Identity whose backward scales the gradient by `bump` when the batch (first dimension) is even: a
    row gradient that depends on the batch's parity. `GradBumpOnEvenBatches.apply(t, bump)`."""

    @staticmethod
    def forward(ctx, t, bump):
        ctx.even, ctx.bump = t.shape[0] % 2 == 0, bump
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad * ctx.bump if ctx.even else grad), None


def odd_sub_batches(plan) -> int:
    """Sub-batches of odd length: those differ from the (even) full batch under a parity fault."""
    assert plan.full_batch % 2 == 0
    return len(plan.seeds) * sum(1 for size in plan.sub_batch_sizes for start in plan.starts(size)
                                 if (min(start + size, plan.full_batch) - start) % 2)


def even_sweep_comparisons(plan) -> int:
    """Sweep comparisons in an even batch (the probe row alone is a batch of one, odd)."""
    per_seed = sum(len(plan.positions(m)) for m in plan.batch_sizes() if m % 2 == 0) * len(plan.probe_rows())
    reversed_batch = len(plan.probe_rows()) if plan.rows % 2 == 0 else 0
    return len(plan.seeds) * (per_seed + reversed_batch)


# --- the rl-kernel rows ---------------------------------------------------------------------------------------

# What every rl_kernel row (adapters/_rl_engine.py: rl_kernel_row) says on a CPU when it checks the device first.
RL_KERNEL_ON_CPU = "RuntimeError: needs CUDA (rl_engine._C extension), got device cpu"


def install(monkeypatch, name, **attrs):
    """A fake module `name` with `attrs` in sys.modules for the test (rl_engine and its op modules)."""
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, module)
    return module


@pytest.fixture
def no_rl_engine(monkeypatch):
    """A fixture (import it into the test module): no rl_engine module in sys.modules during the test."""
    for name in [n for n in sys.modules if n.split(".")[0] == "rl_engine"]:
        monkeypatch.delitem(sys.modules, name)


def rl_kernel_reasons(monkeypatch, adapter, params) -> tuple[str, str]:
    """The rl_kernel row's reasons on CUDA (the device is only looked at): without rl_engine, then with an
    rl_engine that lacks the op (as the reassembly, docs/third_party.md)."""
    monkeypatch.setitem(sys.modules, "rl_engine", None)
    missing = adapter.try_load(CUDA, params)
    install(monkeypatch, "rl_engine")
    return missing, adapter.try_load(CUDA, params)


# --- the quick plan through the runner ------------------------------------------------------------------------

def quick_config(op_name: str):
    """The op's quick plan with one timing repeat: tests that run it look at verdicts, not times."""
    import dataclasses

    from h3bench.harness.config import load_config

    config = load_config(op_name, quick=True)
    return dataclasses.replace(config, timing=dataclasses.replace(config.timing, repeats=1))


def run_quick_plan(op_name: str, adapter, device: torch.device, params_repeatable: Optional[bool] = True):
    """`adapter`'s row through the op's quick plan by the runner, plain mode, one timing repeat (the kernel
    tests look at verdicts, not times); asserts a clean verdict (`assert_clean_quick_verdict`) and returns
    the row."""
    from h3bench.harness.runner import RunRequest, run

    config = quick_config(op_name)
    evidence = run(RunRequest(config=config, device=device, adapters=[adapter], modes=["plain"], out=None,
                              measure_bandwidth=False))
    row = evidence.results["plain"][adapter.name]
    assert_clean_quick_verdict(row, config, params_repeatable)
    return row


def assert_clean_quick_verdict(row, config, params_repeatable: Optional[bool] = True) -> None:
    """A measured row, batch-invariant, its parameter gradients' repeatability as given (None: the op has
    none), and the quick plan's sub-batches and sweep comparisons all run."""
    from h3bench.harness.probes import batch_invariance as bi
    from h3bench.harness.schema import RowResult

    assert isinstance(row, RowResult), row
    inv = row.batch_invariance
    assert inv.batch_invariant is True and inv.params_repeatable is params_repeatable
    assert inv.full_vs_sub_batches.sub_batches == bi.sub_batches_total(config.full_vs_sub)
    assert inv.batch_size_sweep.comparisons == bi.sweep_total(config.sweep)


def assert_accuracy_within(row, config, bound: float, grads: tuple[str, ...]) -> None:
    """Every accuracy size of the config measured, each forward error and each of exactly `grads`'
    errors within `bound`."""
    assert sorted(row.accuracy_latency, key=int) == [str(r) for r in config.accuracy.rows]
    for size in row.accuracy_latency.values():
        assert size.fwd_rel_err <= bound and set(size.grad_rel_err) == set(grads)
        assert all(err <= bound for err in size.grad_rel_err.values()), size.grad_rel_err


def assert_evidence_round_trips(evidence, op_name: str, config) -> None:
    """The evidence names the op and its inputs, and survives the schema's JSON round trip."""
    import dataclasses

    from h3bench.harness import schema

    data = schema.to_dict(evidence)
    assert data["op"] == op_name and data["config"]["inputs"] == dataclasses.asdict(config.inputs)
    assert schema.to_dict(schema.from_json(data)) == data


def assert_no_differences(found, params_repeatable: Optional[bool] = True) -> None:
    """A verdict with nothing differing anywhere: every all_rows case, the sub-batches, the sweep."""
    assert all((c.fwd_differ, c.rowgrad_differ) == (0, 0) for c in found.all_rows.values())
    assert (found.full_vs_sub_batches.fwd_differ, found.full_vs_sub_batches.rowgrad_differ) == (0, 0)
    assert found.batch_size_sweep.differ == 0
    assert found.params_repeatable is params_repeatable and found.batch_invariant is True


def shifted(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values with its shape and strides, one element further on in a fresh buffer (16-byte alignment
    lost): a launch keyed on the aligned tensor must not serve this one."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    out = torch.as_strided(torch.zeros(span + 1, dtype=t.dtype, device=t.device), t.shape, t.stride(), 1)
    return out.copy_(t)


def assert_same_bits(first, second) -> None:
    """Two runs' (output, {name: gradient or None}) are the same bits: output, and every gradient present in
    both (the same names given a gradient, each of the same shape and dtype)."""
    from h3bench.harness.execute import as_bits
    (out1, grads1), (out2, grads2) = first, second
    assert out1.shape == out2.shape and torch.equal(as_bits(out1), as_bits(out2))
    assert grads1.keys() == grads2.keys()
    for name, g1 in grads1.items():
        g2 = grads2[name]
        assert (g1 is None) == (g2 is None), name
        if g1 is not None:
            assert g1.shape == g2.shape and g1.dtype == g2.dtype and torch.equal(as_bits(g1), as_bits(g2)), name


def _gap_fill(t: torch.Tensor):
    """What a strided copy holds between its elements: NaN, or for an index an entry far out of range."""
    return float("nan") if t.is_floating_point() else (1 << 30 if t.dtype == torch.int32 else 1 << 40)


def gapped(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values as a view with no unit stride: every other element, in every dimension, of a buffer laid
    out transposed (a vector: every other element of one twice as long), the gaps holding NaN or an index
    far out of range, so a kernel that reads it at the wrong stride gives other bits or an error."""
    buf = torch.full(tuple(2 * n + 1 for n in reversed(t.shape)), _gap_fill(t), dtype=t.dtype, device=t.device)
    view = buf.permute(*reversed(range(t.dim())))[(slice(1, None, 2),) * t.dim()]
    return view.copy_(t)


def row_gapped(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values as a row-strided view (unit inner stride): columns 2 .. H + 1 of a [..., 2H + 3] buffer
    whose other columns hold what `gapped`'s gaps do; a vector as `gapped`."""
    if t.dim() < 2:
        return gapped(t)
    hidden = t.shape[-1]
    buf = torch.full((*t.shape[:-1], 2 * hidden + 3), _gap_fill(t), dtype=t.dtype, device=t.device)
    return buf[..., 2:2 + hidden].copy_(t)


STRIDED = {"gapped": gapped, "row_gapped": row_gapped}  # tests parametrize over these layouts


def run_norm_modulate_rows(functions: dict, extra: tuple = ()):
    """Plain functions with norm_modulate's signature (name -> function, gradients from autograd) and the
    adapters `extra`, through the quick plan timed once, in one run on the CPU; every row must be measured."""
    from h3bench.harness.adapter import from_function
    from h3bench.harness.runner import RunRequest, run
    from h3bench.harness.schema import RowResult

    adapters = [from_function(fn, name=name, op="norm_modulate", differentiable=("x", "w", "sh", "sc"))
                for name, fn in functions.items()] + list(extra)
    config = quick_config("norm_modulate")
    evidence = run(RunRequest(config=config, device=CPU, adapters=adapters, modes=["plain"], out=None,
                              measure_bandwidth=False))
    rows = evidence.results["plain"]
    assert all(isinstance(r, RowResult) for r in rows.values()), rows
    return evidence
