"""The quick plan (the CPU default of `make run`) flags every kind of fault the full plan flags.

Each planted adapter is the honest composition with one fault, run through the quick plan by the runner;
the honest control must pass the same plan. The faults: a forward that changes only in batches of more
than 100 rows; a forward, and a row gradient, that change only from 256 rows up, and only above 512 rows
(where kernels commonly switch strategy: a row count's power of two, a tile of 256 rows); a row gradient
that depends on the batch's parity; a forward that depends on the row's position in the batch; and table
gradients summed in an order that changes from run to run (which only shows where a table row gets three
or more contributions: with two, a + b == b + a).
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from h3bench.harness.adapter import from_function
from h3bench.harness.config import load_config
from h3bench.harness.ops import OP_MODULES
from h3bench.harness.probes import batch_invariance as bi_totals
from h3bench.harness.runner import RunRequest, run
from tests.helpers import composition, run_norm_modulate_rows

CPU = torch.device("cpu")
QUICK = load_config("norm_modulate", quick=True)
GRADS = ("x", "w", "sh", "sc")
BUMP = 2 ** -5  # larger than a bf16 ulp: changes the bits of every non-zero element


def forward_from(rows: int):
    """The composition whose forward is perturbed in batches of `rows` rows or more (gradients untouched)."""
    def planted(x, w, sh, sc, idx):
        y = composition(x, w, sh, sc, idx)
        return y + (y * BUMP).detach() if x.shape[0] >= rows else y
    return planted


class _BumpGradFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, rows):
        ctx.bump = x.shape[0] >= rows
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad * (1 + BUMP) if ctx.bump else grad), None


def rowgrad_from(rows: int):
    """The composition whose x gradient is perturbed in batches of `rows` rows or more (forward untouched)."""
    def planted(x, w, sh, sc, idx):
        return composition(_BumpGradFrom.apply(x, rows), w, sh, sc, idx)
    return planted


class _BumpGradOnOddBatches(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.odd = x.shape[0] % 2 == 1
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * (1 + BUMP) if ctx.odd else grad


def rowgrad_on_batch_parity(x, w, sh, sc, idx):
    return composition(_BumpGradOnOddBatches.apply(x), w, sh, sc, idx)


def position_dependent_forward(x, w, sh, sc, idx):
    """Every row but the first of its batch is perturbed: a row alone is always first."""
    y = composition(x, w, sh, sc, idx)
    bump = torch.ones_like(y)
    bump[1:] += BUMP
    return y * bump.detach()


_RUNS = itertools.count()


class _TableRowsInRunOrder(torch.autograd.Function):
    """index_select whose backward adds each table row's contributions in bf16, in an order that changes
    with every backward (a stand-in for atomics): the bits change only where a row has >= 3 of them."""

    @staticmethod
    def forward(ctx, table, idx):
        ctx.save_for_backward(idx)
        ctx.rows = table.shape[0]
        return table.index_select(0, idx)

    @staticmethod
    def backward(ctx, grad):
        (idx,) = ctx.saved_tensors
        order = torch.randperm(idx.shape[0], generator=torch.Generator().manual_seed(next(_RUNS)))
        out = torch.zeros((ctx.rows, grad.shape[1]), dtype=grad.dtype)
        for r in order.tolist():
            out[idx[r]] = out[idx[r]] + grad[r]  # rounded to the table's dtype at every step
        return out, None


def table_grads_in_run_order(x, w, sh, sc, idx):
    n = torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-5)
    return n * (1 + _TableRowsInRunOrder.apply(sc, idx)) + _TableRowsInRunOrder.apply(sh, idx)


def honest(x, w, sh, sc, idx):
    return composition(x, w, sh, sc, idx)


# name: (the fault, the smallest batch it perturbs) for the faults that switch on at a batch size
SWITCHING = {
    "forward_above_100_rows": (forward_from(101), 101),
    "forward_from_256_rows": (forward_from(256), 256),
    "forward_above_512_rows": (forward_from(513), 513),
    "rowgrad_from_256_rows": (rowgrad_from(256), 256),
    "rowgrad_above_512_rows": (rowgrad_from(513), 513),
}

PLANTED = {
    **{name: fn for name, (fn, _) in SWITCHING.items()},
    "rowgrad_on_batch_parity": rowgrad_on_batch_parity,
    "position_dependent_forward": position_dependent_forward,
    "table_grads_in_run_order": table_grads_in_run_order,
}


@pytest.fixture(scope="module")
def quick_rows() -> dict:
    """Every planted adapter and the control, through the quick plan in one run."""
    return run_norm_modulate_rows({**PLANTED, "honest": honest}).results["plain"]


def sub_batch_rows(plan) -> list[int]:
    """The rows of every sub-batch the plan compares, in the probe's order (the last tile of a size that
    does not divide the full batch is cut short)."""
    return [min(start + size, plan.full_batch) - start
            for _ in plan.seeds for size in plan.sub_batch_sizes for start in plan.starts(size)]


def sweep_batch_rows(plan) -> list[int]:
    """The batch size of every sweep comparison (each against its probe row alone)."""
    per_seed = [m for m in plan.batch_sizes() for _ in plan.probe_rows() for _ in plan.positions(m)]
    return (per_seed + [plan.rows] * len(plan.probe_rows())) * len(plan.seeds)


def test_the_plan_arithmetic_is_the_probes():
    assert len(sub_batch_rows(QUICK.full_vs_sub)) == bi_totals.sub_batches_total(QUICK.full_vs_sub)
    assert len(sweep_batch_rows(QUICK.sweep)) == bi_totals.sweep_total(QUICK.sweep)


def test_the_quick_plan_has_what_the_faults_need():
    layout = QUICK.inputs
    subs = sub_batch_rows(QUICK.full_vs_sub)
    assert QUICK.full_vs_sub.full_batch > 100 >= min(subs)
    # some table row gets at least three contributions in the largest all_rows batch
    from h3bench.harness.ops import get_op

    n = max(QUICK.all_rows.batch_sizes)
    counts = torch.bincount(get_op("norm_modulate").layout(layout, n, QUICK.all_rows.seeds[0]))
    assert int(counts.max()) >= 3


@pytest.mark.parametrize("op", OP_MODULES)
def test_every_quick_plan_crosses_256_and_512_rows(op):
    """Batches and sub-batches on both sides of each switch point, in every op's quick config: the full
    batch above 512 rows, sub-batches of 255 and 257, 511, 512 and 513 rows, and sweep batches of 255,
    256 and 257 rows (each compared with its probe row alone)."""
    config = load_config(op, quick=True)
    assert config.quick and config.full_vs_sub.full_batch > 513
    subs = set(sub_batch_rows(config.full_vs_sub))
    assert {255, 257, 511, 512, 513} <= subs and min(subs) < 255
    assert {255, 256, 257} <= set(config.sweep.batch_sizes())


def test_honest_control_passes(quick_rows):
    bi = quick_rows["honest"].batch_invariance
    assert bi.batch_invariant is True and bi.params_repeatable is True


@pytest.mark.parametrize("name", SWITCHING)
def test_a_fault_that_switches_on_at_a_batch_size_is_flagged(quick_rows, name):
    """The full batch (above 512 rows) takes the fault; exactly the sub-batches below its size differ, and
    exactly the sweep comparisons in batches of its size or more; the all_rows batches (at most 32 rows)
    and the parameter gradients see nothing."""
    _, rows = SWITCHING[name]
    bi = quick_rows[name].batch_invariance
    assert bi.batch_invariant is False and bi.params_repeatable is True
    assert QUICK.full_vs_sub.full_batch >= rows
    subs = bi.full_vs_sub_batches
    differ_subs = sum(1 for n in sub_batch_rows(QUICK.full_vs_sub) if n < rows)
    differ_sweep = sum(1 for n in sweep_batch_rows(QUICK.sweep) if n >= rows)
    assert differ_subs > 0
    assert all((c.fwd_differ, c.rowgrad_differ) == (0, 0) for c in bi.all_rows.values())
    assert bi.batch_size_sweep.differ == differ_sweep
    if name.startswith("forward"):
        assert (subs.fwd_differ, subs.rowgrad_differ) == (differ_subs, 0)
        assert subs.first_difference.tensor == "y"
    else:
        assert (subs.fwd_differ, subs.rowgrad_differ) == (0, differ_subs)
        assert subs.first_difference.tensor == "grad x"
    assert subs.first_difference.batch < rows
    if differ_sweep:
        assert bi.batch_size_sweep.first_failures[0].batch == min(n for n in QUICK.sweep.batch_sizes() if n >= rows)


def test_rowgrad_on_batch_parity_is_flagged(quick_rows):
    bi = quick_rows["rowgrad_on_batch_parity"].batch_invariance
    assert bi.batch_invariant is False
    # all_rows: the 32-row batch is even, each row alone is odd
    assert bi.all_rows["32"].rowgrad_differ == 32 and bi.all_rows["3"].rowgrad_differ == 0
    assert all(c.fwd_differ == 0 for c in bi.all_rows.values())
    assert bi.batch_size_sweep.differ > 0


def test_position_dependent_forward_is_flagged(quick_rows):
    bi = quick_rows["position_dependent_forward"].batch_invariance
    assert bi.batch_invariant is False
    assert bi.all_rows["3"].fwd_differ == 2 and bi.all_rows["32"].fwd_differ == 31  # all but the first
    assert bi.batch_size_sweep.differ > 0


def test_run_order_table_gradients_are_flagged(quick_rows):
    bi = quick_rows["table_grads_in_run_order"].batch_invariance
    assert bi.params_repeatable is False and bi.batch_invariant is False
    # nothing per row changes: only the repeatability check sees it
    assert all((c.fwd_differ, c.rowgrad_differ) == (0, 0) for c in bi.all_rows.values())
    assert bi.batch_size_sweep.differ == 0


def test_a_plan_without_the_large_batches_misses_two_of_them():
    """What the quick plan's 640-row full batch and 32-row all_rows batch are for: the same probes with a
    64-row full batch and all_rows batches of 3 and 8 rows (no table row gets three contributions) pass the
    >100-row forward and the run-order table sums, which the quick plan flags (tests above)."""
    from h3bench.harness.config import AllRowsPlan, SubBatchPlan, SweepPlan

    old = dataclasses.replace(
        QUICK, all_rows=AllRowsPlan(batch_sizes=(3, 8), seeds=(3,)),
        full_vs_sub=SubBatchPlan(full_batch=64, seeds=(3,), sub_batch_sizes=(1, 7, 33), dense_from=16, spread=4),
        sweep=SweepPlan(rows=16, seeds=(3,), small_sizes=2, first_power=8, probe_spread=1, max_failures=8),
        timing=dataclasses.replace(QUICK.timing, repeats=1))
    adapters = [from_function(PLANTED[name], name=name, op="norm_modulate", differentiable=GRADS)
                for name in ("forward_above_100_rows", "table_grads_in_run_order")]
    rows = run(RunRequest(config=old, device=CPU, adapters=adapters, modes=["plain"], out=None,
                          measure_bandwidth=False)).results["plain"]
    assert all(r.batch_invariance.batch_invariant for r in rows.values())


def test_a_plan_below_256_rows_misses_the_switching_faults():
    """What the sizes are for: the same probes with every batch below 256 rows (a 160-row full batch, a
    sweep of 8 rows) pass the faults that switch on at 256 and above 512 rows."""
    from h3bench.harness.config import SubBatchPlan, SweepPlan

    small = dataclasses.replace(
        QUICK, full_vs_sub=SubBatchPlan(full_batch=160, seeds=(3,), sub_batch_sizes=(1, 7, 33, 100), dense_from=16,
                                        spread=8),
        sweep=SweepPlan(rows=8, seeds=(3,), small_sizes=1, first_power=8, probe_spread=0, max_failures=8),
        timing=dataclasses.replace(QUICK.timing, repeats=1))
    names = [name for name, (_, rows) in SWITCHING.items() if rows >= 256]
    adapters = [from_function(PLANTED[name], name=name, op="norm_modulate", differentiable=GRADS) for name in names]
    rows = run(RunRequest(config=small, device=CPU, adapters=adapters, modes=["plain"], out=None,
                          measure_bandwidth=False)).results["plain"]
    assert sorted(rows) == sorted(names) and all(r.batch_invariance.batch_invariant for r in rows.values())
