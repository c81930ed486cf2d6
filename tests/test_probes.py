"""The batch-invariance probes catch planted faults with exact counts, and pass an honest adapter.

Each planted fault makes the forward, the row gradient or a parameter gradient depend on something
that must not matter (the batch size's parity, or how many backwards ran before). Since the probes'
loop order is documented (sizes ascending, probe rows ascending, positions ascending, then the
reversed batch), the expected counts and first failures are computed here from the plan alone.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
import torch

from h3bench.harness import schema
from h3bench.harness.adapter import Adapter, from_function
from h3bench.harness.config import AllRowsPlan, SubBatchPlan, SweepPlan, TimingPlan, load_config
from h3bench.harness.ops import get_op
from h3bench.harness.probes import batch_invariance as bi
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import RowResult, SweepFailure, UnavailableRow
from tests.helpers import composition, even

CPU = torch.device("cpu")
OP = get_op("norm_modulate")
GRADS = ("x", "w", "sh", "sc")
QUICK = load_config("norm_modulate", quick=True)
# Batch sizes chosen so the expected counts are obvious: 4 is even (perturbed), 5 and 1 are odd.
ALL_ROWS = dataclasses.replace(QUICK.all_rows, batch_sizes=(4, 5), seeds=(3, 4))
# Pinned here, not taken from the quick config, so the hand-computed counts below stay true when
# the quick plan is retuned for speed.
SUBS = SubBatchPlan(full_batch=96, seeds=(3, 4), sub_batch_sizes=(1, 7, 33), dense_from=16, spread=8)
SWEEP = SweepPlan(rows=32, seeds=(3, 4), small_sizes=3, first_power=16, probe_spread=2, max_failures=8)
# The probe plans are the quick ones; only the latency sampling is cut to one sample.
FAST_TIMING = TimingPlan(warmup=0, reps=1, repeats=1, block=1)
BUMP = 1 + 2 ** -5  # larger than a bf16 ulp (<= 2^-7 relative): changes the bits of every non-zero


# --- planted faults ---------------------------------------------------------------------------------

def forward_on_even_batches(x, w, sh, sc, idx):
    """(a) The forward of an even-sized batch is perturbed; gradients are untouched (detached)."""
    y = composition(x, w, sh, sc, idx)
    if even(x):
        y = y + (y * 2 ** -5).detach()
    return y


class _ScaleGradOnEvenBatches(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.even = even(x)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * BUMP if ctx.even else grad


def rowgrad_on_even_batches(x, w, sh, sc, idx):
    """(b) Identity on x whose backward scales the gradient when the batch is even."""
    return composition(_ScaleGradOnEvenBatches.apply(x), w, sh, sc, idx)


_BACKWARDS = itertools.count()


class _ScaleGradEveryOtherBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * BUMP if next(_BACKWARDS) % 2 else grad


def unrepeatable(name: str):
    """(c) The gradient of parameter `name` changes from one backward to the next."""
    def fn(x, w, sh, sc, idx):
        args = {"x": x, "w": w, "sh": sh, "sc": sc}
        args[name] = _ScaleGradEveryOtherBackward.apply(args[name])
        return composition(**args, idx=idx)
    fn.__name__ = f"unrepeatable_{name}"
    return fn


FAULTS = {
    "honest": (composition, GRADS),
    "forward_only": (composition, ()),
    "fwd_even": (forward_on_even_batches, GRADS),
    "fwd_even_forward_only": (forward_on_even_batches, ()),
    "rowgrad_even": (rowgrad_on_even_batches, GRADS),
    "unrepeatable_w": (unrepeatable("w"), GRADS),
    "unrepeatable_sh": (unrepeatable("sh"), GRADS),
    "unrepeatable_sc": (unrepeatable("sc"), GRADS),
}


def context(name: str, progress=None) -> ProbeContext:
    fn, grads = FAULTS[name]
    adapter = from_function(fn, name=name, op="norm_modulate", differentiable=grads)
    assert adapter.grads == grads
    extra = {"progress": progress} if progress else {}
    return ProbeContext(op=OP, params=QUICK.inputs, fn=adapter.load(CPU, QUICK.inputs).fn, grads=adapter.grads,
                        device=CPU, reference_variant=OP.name, **extra)


@functools.cache
def probed(name: str) -> schema.BatchInvariance:
    ctx = context(name)
    cases, repeatable = bi.all_rows(ctx, ALL_ROWS)
    return bi.verdict(cases, repeatable, bi.full_vs_sub_batches(ctx, SUBS), bi.batch_size_sweep(ctx, SWEEP))


# --- expected counts, from the plan alone -------------------------------------------------------------

def all_rows_expected(differs) -> dict[str, int]:
    """Rows per case that differ when a batch of n differs from a batch of 1 exactly if differs(n, 1)."""
    return {str(n): (n * len(ALL_ROWS.seeds) if differs(n, 1) else 0) for n in ALL_ROWS.batch_sizes}


def parity_differs(a: int, b: int) -> bool:
    return a % 2 != b % 2


def sub_batches_expected(plan: SubBatchPlan) -> int:
    count = 0
    for size in plan.sub_batch_sizes:
        for start in plan.starts(size):
            taken = min(start + size, plan.full_batch) - start  # the last one may be cut short
            count += parity_differs(taken, plan.full_batch)
    return count * len(plan.seeds)


def sweep_expected_count(plan: SweepPlan) -> int:
    n, probes = plan.rows, plan.probe_rows()
    per_seed = sum(len(plan.positions(m)) for m in plan.batch_sizes() if m % 2 == 0) * len(probes)
    per_seed += len(probes) if n % 2 == 0 else 0  # the whole batch reversed
    return per_seed * len(plan.seeds)


def labels(failures: list[SweepFailure]) -> list[tuple[int, int, int, int]]:
    """(seed, batch, position, row) of each failure: where it was found (its located difference aside)."""
    return [(f.seed, f.batch, f.position, f.row) for f in failures]


def sweep_expected_failures(plan: SweepPlan) -> list[SweepFailure]:
    """Every even-batch comparison in the documented loop order."""
    n, out = plan.rows, []
    for seed in plan.seeds:
        for m in plan.batch_sizes():
            for r in plan.probe_rows():
                out += [SweepFailure(seed, m, p, r) for p in plan.positions(m) if m % 2 == 0]
        if n % 2 == 0:
            out += [SweepFailure(seed, n, n - 1 - r, r) for r in plan.probe_rows()]
    return out


def test_quick_plan_arithmetic():
    """The hand-computed numbers the assertions below rest on, for the quick plan."""
    assert SWEEP.batch_sizes() == [1, 2, 3, 15, 16, 17, 31, 32]
    assert SWEEP.probe_rows() == [0, 7, 11, 31]
    assert bi.sweep_total(SWEEP) == 2 * (4 * (1 + 2 + 3 * 6) + 4) == 176
    assert sweep_expected_count(SWEEP) == 2 * (4 * (2 + 3 + 3) + 4) == 72
    # sizes 1 and 7 start every 96 // 8 = 12 rows (8 each, all odd); 33 tiles: 33, 33, then 30 (even)
    assert bi.sub_batches_total(SUBS) == 2 * (8 + 8 + 3)
    assert sub_batches_expected(SUBS) == 2 * (8 + 8 + 2)
    assert all_rows_expected(parity_differs) == {"4": 8, "5": 0}


# --- (a) forward depends on the batch -----------------------------------------------------------------

def test_forward_fault_all_rows():
    found = probed("fwd_even")
    assert {k: (c.rows, c.fwd_differ, c.rowgrad_differ) for k, c in found.all_rows.items()} == {
        "4": (8, 8, 0), "5": (10, 0, 0)}
    assert found.params_repeatable is True
    assert found.batch_invariant is False


def test_forward_fault_full_vs_sub_batches():
    subs = probed("fwd_even").full_vs_sub_batches
    assert (subs.full_batch, subs.sub_batch_sizes) == (96, [1, 7, 33])
    assert subs.sub_batches == bi.sub_batches_total(SUBS) == 38
    assert subs.fwd_differ == sub_batches_expected(SUBS) == 36
    assert subs.rowgrad_differ == 0


def test_forward_fault_sweep_counts_and_first_failures():
    sweep = probed("fwd_even").batch_size_sweep
    assert sweep.batch_sizes == SWEEP.batch_sizes() and sweep.probe_rows == SWEEP.probe_rows()
    assert sweep.comparisons == bi.sweep_total(SWEEP)
    assert sweep.differ == sweep_expected_count(SWEEP) == 72
    first = SWEEP.probe_rows()[0]
    assert labels(sweep.first_failures[:1]) == [(3, 2, 0, first)]
    assert labels(sweep.first_failures) == labels(sweep_expected_failures(SWEEP)[:SWEEP.max_failures])
    assert len(sweep.first_failures) == SWEEP.max_failures == 8


def test_forward_fault_sweep_lists_every_failure_in_loop_order():
    plan = dataclasses.replace(SWEEP, max_failures=10_000)
    sweep = bi.batch_size_sweep(context("fwd_even"), plan)
    expected = sweep_expected_failures(plan)
    assert labels(sweep.first_failures) == labels(expected)
    assert sweep.differ == len(expected)
    # the reversed batch (32 rows, even) is among them: probe row r sits at position 31 - r
    assert (4, 32, 31 - 7, 7) in labels(sweep.first_failures)


def test_forward_fault_in_a_forward_only_row():
    found = probed("fwd_even_forward_only")
    assert {k: (c.fwd_differ, c.rowgrad_differ) for k, c in found.all_rows.items()} == {
        "4": (8, 0), "5": (0, 0)}
    assert found.params_repeatable is None
    assert found.full_vs_sub_batches.fwd_differ == 36 and found.full_vs_sub_batches.rowgrad_differ == 0
    assert found.batch_size_sweep.differ == 72
    assert found.batch_invariant is False


# --- (b) row gradient depends on the batch -------------------------------------------------------------

def test_rowgrad_fault():
    found = probed("rowgrad_even")
    assert {k: (c.rows, c.fwd_differ, c.rowgrad_differ) for k, c in found.all_rows.items()} == {
        "4": (8, 0, 8), "5": (10, 0, 0)}
    subs = found.full_vs_sub_batches
    assert (subs.sub_batches, subs.fwd_differ, subs.rowgrad_differ) == (38, 0, 36)
    sweep = found.batch_size_sweep
    assert sweep.differ == 72
    assert labels(sweep.first_failures) == labels(sweep_expected_failures(SWEEP)[:8])
    assert found.params_repeatable is True
    assert found.batch_invariant is False


# --- (c) parameter gradients not repeatable ------------------------------------------------------------

@pytest.mark.parametrize("param", ["w", "sh", "sc"])
def test_unrepeatable_parameter_gradient(param):
    found = probed(f"unrepeatable_{param}")
    assert found.params_repeatable is False
    assert found.batch_invariant is False
    assert all((c.fwd_differ, c.rowgrad_differ) == (0, 0) for c in found.all_rows.values())
    assert (found.full_vs_sub_batches.fwd_differ, found.full_vs_sub_batches.rowgrad_differ) == (0, 0)
    assert found.batch_size_sweep.differ == 0 and found.batch_size_sweep.first_failures == []


# --- (d) honest rows ----------------------------------------------------------------------------------

def assert_clean(found: schema.BatchInvariance) -> None:
    assert {k: (c.rows, c.fwd_differ, c.rowgrad_differ) for k, c in found.all_rows.items()} == {
        "4": (8, 0, 0), "5": (10, 0, 0)}
    subs = found.full_vs_sub_batches
    assert (subs.sub_batches, subs.fwd_differ, subs.rowgrad_differ) == (38, 0, 0)
    sweep = found.batch_size_sweep
    assert (sweep.comparisons, sweep.differ, sweep.first_failures) == (176, 0, [])
    assert found.batch_invariant is True


def test_honest_adapter_passes():
    found = probed("honest")
    assert_clean(found)
    assert found.params_repeatable is True


def test_forward_only_adapter():
    found = probed("forward_only")
    assert_clean(found)
    assert found.params_repeatable is None


@pytest.mark.parametrize("dirty", ["fwd_all_rows", "rowgrad_all_rows", "fwd_subs", "rowgrad_subs", "sweep",
                                   "params", None])
def test_verdict_needs_every_count_zero_and_repeatable_params(dirty):
    found = probed("honest")
    cases = {k: dataclasses.replace(c) for k, c in found.all_rows.items()}
    subs = dataclasses.replace(found.full_vs_sub_batches)
    sweep = dataclasses.replace(found.batch_size_sweep)
    repeatable = found.params_repeatable
    if dirty == "fwd_all_rows":
        cases["5"].fwd_differ = 1
    elif dirty == "rowgrad_all_rows":
        cases["4"].rowgrad_differ = 1
    elif dirty == "fwd_subs":
        subs.fwd_differ = 1
    elif dirty == "rowgrad_subs":
        subs.rowgrad_differ = 1
    elif dirty == "sweep":
        sweep.differ = 1
    elif dirty == "params":
        repeatable = False
    assert bi.verdict(cases, repeatable, subs, sweep).batch_invariant is (dirty is None)
    assert bi.verdict(cases, None, subs, sweep).batch_invariant is (dirty in (None, "params"))


def test_sweep_batches_follow_the_documented_seeded_fill():
    """Each sweep batch is the probe row among m-1 others from randperm(n) of a CPU generator seeded
    with the seed, at each position; the batch reversed last. Rows are identified by their x bits."""
    plan = dataclasses.replace(SWEEP, seeds=(3, 4))
    calls: list[torch.Tensor] = []

    def recording(x, w, sh, sc, idx):
        calls.append(x.detach().clone())
        return composition(x, w, sh, sc, idx)

    adapter = from_function(recording, name="recording", op="norm_modulate", differentiable=GRADS)
    ctx = ProbeContext(op=OP, params=QUICK.inputs, fn=adapter.load(CPU, QUICK.inputs).fn, grads=GRADS, device=CPU,
                       reference_variant=OP.name)
    bi.batch_size_sweep(ctx, plan)
    n, probes, expected = plan.rows, plan.probe_rows(), []
    for seed in plan.seeds:
        expected += [(seed, [r]) for r in probes]  # each probe row alone first
        gen = torch.Generator().manual_seed(seed)
        for m in plan.batch_sizes():
            for r in probes:
                perm = torch.randperm(n, generator=gen)
                others = [i for i in perm.tolist() if i != r][:m - 1]
                expected += [(seed, others[:p] + [r] + others[p:]) for p in plan.positions(m)]
        expected += [(seed, list(range(n - 1, -1, -1)))] * len(probes)
    assert len(calls) == len(expected)
    rows_of = {seed: {bytes(row.view(torch.int16).numpy()): i
                      for i, row in enumerate(OP.make_inputs(QUICK.inputs, n, seed, CPU).tensors["x"])}
               for seed in plan.seeds}
    for call, (seed, order) in zip(calls, expected):
        assert [rows_of[seed][bytes(row.view(torch.int16).numpy())] for row in call] == order


def test_progress_adds_up_to_the_declared_totals():
    done = []
    ctx = context("honest", progress=done.append)
    bi.all_rows(ctx, ALL_ROWS)
    assert sum(done) == bi.all_rows_total(ALL_ROWS) == 18
    done.clear()
    bi.full_vs_sub_batches(ctx, SUBS)
    assert sum(done) == bi.sub_batches_total(SUBS)
    done.clear()
    bi.batch_size_sweep(ctx, SWEEP)
    assert sum(done) == bi.sweep_total(SWEEP)


# --- through the runner -------------------------------------------------------------------------------

def test_h3bench_triton_passes_the_quick_plan(tmp_path):
    from h3bench.adapters.norm_modulate.h3bench_triton import ADAPTER
    from h3bench.kernels.common import interpreter_active

    if not interpreter_active():
        pytest.skip("the Triton interpreter is off (TRITON_INTERPRET=1 is set by conftest on CPU runs)")

    config = dataclasses.replace(QUICK, timing=FAST_TIMING)
    out = tmp_path / "e.json"
    evidence = run(RunRequest(config=config, device=CPU, adapters=[ADAPTER], modes=["plain"], out=out,
                              measure_bandwidth=False))
    row = evidence.results["plain"]["h3bench_triton"]
    assert isinstance(row, RowResult), row
    inv = row.batch_invariance
    assert inv.batch_invariant is True and inv.params_repeatable is True
    assert inv.batch_size_sweep.comparisons == bi.sweep_total(QUICK.sweep)
    assert inv.full_vs_sub_batches.sub_batches == bi.sub_batches_total(QUICK.full_vs_sub)
    assert sorted(row.accuracy_latency, key=int) == [str(r) for r in QUICK.accuracy.rows]
    for size in row.accuracy_latency.values():
        assert size.fwd_rel_err <= 0.0045
        assert set(size.grad_rel_err) == set(GRADS)
        assert all(err <= 0.005 for err in size.grad_rel_err.values()), size.grad_rel_err
    assert schema.to_dict(schema.load(out)) == schema.to_dict(evidence)


def _raising_at(rows: int):
    def planted(x, w, sh, sc, idx):
        if x.shape[0] == rows:
            raise RuntimeError(f"planted failure at {rows} rows\nsecond line of the message")
        return composition(x, w, sh, sc, idx)
    return planted


# Row counts that occur in exactly one probe of this plan (the first run of all_rows has 5 rows).
@pytest.mark.parametrize("rows,probe", [(5, "all_rows"), (96, "full_vs_sub_batches"),
                                        (2, "batch_size_sweep"), (130, "accuracy_latency")])
def test_adapter_raising_in_a_probe_is_an_unavailable_row(rows, probe):
    planted = from_function(_raising_at(rows), name="planted", op="norm_modulate", differentiable=GRADS,
                            source="planted source")
    honest = from_function(composition, name="honest", op="norm_modulate", differentiable=GRADS)
    config = dataclasses.replace(QUICK, all_rows=AllRowsPlan(batch_sizes=(5, 17), seeds=(3,)), full_vs_sub=SUBS,
                                 sweep=SWEEP, accuracy=dataclasses.replace(QUICK.accuracy, rows=(17, 130)),
                                 timing=FAST_TIMING)
    evidence = run(RunRequest(config=config, device=CPU, adapters=[planted, honest], modes=["plain"],
                              out=None, measure_bandwidth=False))
    rows_found = evidence.results["plain"]
    assert list(rows_found) == ["planted", "honest"]
    bad = rows_found["planted"]
    assert isinstance(bad, UnavailableRow)
    assert bad.unavailable == f"RuntimeError: planted failure at {rows} rows"
    assert bad.failed_probe == probe
    assert bad.source == "planted source"
    good = rows_found["honest"]
    assert isinstance(good, RowResult) and good.batch_invariance.batch_invariant is True
    assert schema.from_json(schema.to_dict(evidence)).results["plain"]["planted"] == bad


def test_adapter_failing_to_load_is_an_unavailable_row():
    def load(_device, _params):
        raise ImportError("No module named 'not_installed'")

    missing = Adapter(name="missing", op="norm_modulate", grads=GRADS, load=load)
    honest = from_function(composition, name="honest", op="norm_modulate", differentiable=GRADS)
    config = dataclasses.replace(QUICK, timing=FAST_TIMING)
    evidence = run(RunRequest(config=config, device=CPU, adapters=[missing, honest], modes=["plain"],
                              out=None, measure_bandwidth=False))
    row = evidence.results["plain"]["missing"]
    assert isinstance(row, UnavailableRow)
    assert row.unavailable == "ImportError: No module named 'not_installed'"
    assert row.failed_probe is None
    assert isinstance(evidence.results["plain"]["honest"], RowResult)


# --- known harness bug, documented ---------------------------------------------------------------------

def every_multi_row_batch(x, w, sh, sc, idx):
    """Every batch of more than one row is perturbed: every such comparison must count."""
    y = composition(x, w, sh, sc, idx)
    return y + (y * 2 ** -5).detach() if x.shape[0] > 1 else y


FAULTS["every_multi_row_batch"] = (every_multi_row_batch, GRADS)


def test_sweep_smaller_than_its_small_sizes_misses_nothing():
    plan = dataclasses.replace(SWEEP, rows=4, small_sizes=9, seeds=(3,), max_failures=1000)
    sweep = bi.batch_size_sweep(context("every_multi_row_batch"), plan)
    assert all(m <= plan.rows for m in sweep.batch_sizes), sweep.batch_sizes
    alone_sized = len(plan.probe_rows()) * len(plan.positions(1))  # batch 1 equals the row alone
    assert sweep.differ == sweep.comparisons - alone_sized


def test_probes_do_not_hold_parameter_gradients_of_the_runs_they_keep(monkeypatch):
    """all_rows keeps every single-row outcome of a batch and the sweep its probe rows alone; with
    their parameter gradients (full size even for one row) adaln_projection's all_rows filled the
    H200's 140 GB. At most the two full-batch runs' parameter gradients may be alive at once."""
    import weakref
    ctx = context("honest")
    alive: set[int] = set()
    peak = [0]
    real_run = ProbeContext.run

    def counting_run(self, inputs, grad_outs):
        outcome = real_run(self, inputs, grad_outs)
        for g in self.param_grads:
            key = id(outcome.grads[g])
            alive.add(key)
            weakref.finalize(outcome.grads[g], alive.discard, key)
        peak[0] = max(peak[0], len(alive))
        return outcome
    monkeypatch.setattr(ProbeContext, "run", counting_run)
    bi.all_rows(ctx, dataclasses.replace(ALL_ROWS, batch_sizes=(12,), seeds=(3,)))
    assert peak[0] <= 3 * len(ctx.param_grads), peak[0]   # full, again, and the run being made
    peak[0] = 0
    bi.batch_size_sweep(ctx, SWEEP)
    bi.full_vs_sub_batches(ctx, SUBS)
    assert peak[0] <= 3 * len(ctx.param_grads), peak[0]


def test_the_bitwise_probes_wait_for_the_device_once_a_case_not_once_a_call(monkeypatch):
    """The RFC's three probes run thousands of one-row calls; each waits for nothing (its kernels stay
    queued) and the probe waits once before it reads its flags back, inside the implementation's block."""
    from h3bench.harness import execute
    settles: list[int] = []
    real_settle = execute.settle
    monkeypatch.setattr(execute, "settle", lambda tensors: (settles.append(1), real_settle(tensors)))
    runs: list[bool] = []
    real_execute = execute.execute

    def recording(*args, **kwargs):
        runs.append(kwargs.get("settled", args[6] if len(args) > 6 else True))
        return real_execute(*args, **kwargs)
    monkeypatch.setattr("h3bench.harness.probes.context.execute", recording)
    ctx = context("honest")
    plan = dataclasses.replace(ALL_ROWS, batch_sizes=(12,), seeds=(3,))
    bi.all_rows(ctx, plan)
    assert len(runs) == 2 + 12 and not any(runs)
    assert len(settles) == 2  # after the two full batches, after the rows alone
    runs.clear(), settles.clear()
    bi.full_vs_sub_batches(ctx, SUBS)
    assert len(runs) == len(SUBS.seeds) + bi.sub_batches_total(SUBS) and not any(runs)
    assert len(settles) == len(SUBS.seeds)
    runs.clear(), settles.clear()
    bi.batch_size_sweep(ctx, SWEEP)
    assert len(runs) > 100 and not any(runs) and len(settles) == 1
    assert ctx.settled  # the probes' own queued context; the caller's still waits each call


def test_a_fault_a_queued_call_leaves_is_the_rows(monkeypatch):
    """A queued call's asynchronous fault surfaces at the probe's wait, inside the implementation's block:
    the row's failure, not the harness's. Stand-in for the GPU: the wait raises as CUDA's would."""
    from h3bench.harness import execute

    def faulting_settle(tensors):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(execute, "settle", faulting_settle)
    with pytest.raises(execute.ImplementationError, match="illegal memory access"):
        context("honest").queued().settle()


def test_a_row_records_the_reference_its_errors_are_against():
    """A row that computes only part of the op (torch_rms_norm: the norm, no modulation) has its errors
    against that part's float64 reference; the file says which, so they are not read as the op's."""
    from h3bench.adapters import builtin_adapters
    alone = next(a for a in builtin_adapters("norm_modulate") if a.name == "torch_rms_norm")
    honest = from_function(composition, name="honest", op="norm_modulate", differentiable=GRADS)
    config = dataclasses.replace(QUICK, timing=FAST_TIMING)
    evidence = run(RunRequest(config=config, device=CPU, adapters=[alone, honest], modes=["plain"],
                              out=None, measure_bandwidth=False))
    rows = evidence.results["plain"]
    assert rows["torch_rms_norm"].reference == "rms_norm" and rows["honest"].reference is None
    assert schema.to_dict(evidence)["results"]["plain"]["torch_rms_norm"]["reference"] == "rms_norm"
    from rich.console import Console
    from h3bench.harness.progress import summary_table
    from h3bench.reports.table import render_markdown
    assert "| torch_rms_norm (against rms_norm) |" in render_markdown(evidence)
    console = Console(width=400, record=True)
    console.print(summary_table(evidence))
    assert "the row computes: torch_rms_norm (rms_norm)" in " ".join(console.export_text().split())
