"""Batch invariance, bitwise: a row's outputs and row gradients must not depend on the batch it rides in,
and parameter gradients must repeat run to run. Method and counts: docs/probes.md.

Ops with several outputs or per-row gradients (docs/operators.md, "Common to all"): a row's forward differs when any of its
outputs differs (so `fwd_differ` counts rows, or sub-batches, as in the prior art); the per-row
gradients are compared one by one and their counts summed into `rowgrad_differ`; a sweep comparison
differs when any output or per-row gradient of the probe row differs.

Comparisons stay on the device as bool tensors and are read back once per case, and the runs leave
their kernels queued (`ProbeContext.queued`), waited for once before each read-back (`settle`), so a probe
costs the implementation's runs, not a host sync per row. A failing check is then located (harness/probes/
difference.py: the first differing tensor, row and element, the largest ULP distance): all_rows from the
results at hand, the first differing sub-batch and the first `max_failures` sweep comparisons by running
them again, so a clean row pays nothing for it.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from h3bench.harness.config import AllRowsPlan, SubBatchPlan, SweepPlan
from h3bench.harness.execute import Outcome, any_rows_differ, bitwise_equal, rows_differ
from h3bench.harness.probes.comparison import pairs, picked_at
from h3bench.harness.probes.context import ProbeContext, select_grad_outs
from h3bench.harness.probes.difference import first_difference, param_difference
from h3bench.harness.probes.registry import ProbeSpec, Role, beyond_rfc
from h3bench.harness.schema import (AllRowsCase, BatchInvariance, BatchSizeSweep, Difference, FullVsSubBatches,
                                    ParamDifference, SweepFailure)


def totals(config) -> dict[str, int]:
    """Progress units of the RFC's three probes under a run's config (harness/config.py's RunConfig)."""
    return {"all_rows": all_rows_total(config.all_rows),
            "full_vs_sub_batches": sub_batches_total(config.full_vs_sub),
            "batch_size_sweep": sweep_total(config.sweep)}


def all_rows_total(plan: AllRowsPlan) -> int:
    return len(plan.seeds) * sum(plan.batch_sizes)


def sub_batches_total(plan: SubBatchPlan) -> int:
    return len(plan.seeds) * sum(len(plan.starts(size)) for size in plan.sub_batch_sizes)


def sweep_total(plan: SweepPlan) -> int:
    per_seed = sum(len(plan.positions(m)) for m in plan.batch_sizes()) * len(plan.probe_rows())
    return len(plan.seeds) * (per_seed + len(plan.probe_rows()))


def _outputs_differ(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return any_rows_differ(list(zip(a, b)))


def _cat_outputs(outcomes: list[Outcome]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.cat([o.outputs[i] for o in outcomes]) for i in range(len(outcomes[0].outputs)))


def _rowgrads_differ(ctx: ProbeContext, a: Outcome, b_grads: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """One per-row flag tensor per per-row gradient."""
    return [rows_differ(a.grads[g], b_grads[g]) for g in ctx.row_grads]


def all_rows(ctx: ProbeContext, plan: AllRowsPlan,
             params_differences: Optional[list[ParamDifference]] = None) -> tuple[dict[str, AllRowsCase], Optional[bool]]:
    """Each row of a batch of n against the same row alone; the batch twice for parameter repeatability
    (each parameter gradient that does not repeat is added to `params_differences`, once)."""
    ctx = ctx.queued()
    cases: dict[str, AllRowsCase] = {}
    repeatable: Optional[bool] = True if ctx.param_grads else None
    for n in plan.batch_sizes:
        fwd = rowgrad = 0
        first: Optional[Difference] = None
        for seed in plan.seeds:
            inputs, grad_outs = ctx.inputs(n, seed), ctx.grad_outs(n, seed)
            full = ctx.run(inputs, grad_outs)
            again = ctx.run(inputs, grad_outs)
            ctx.settle()
            for g in ctx.param_grads:
                if not bitwise_equal(full.grads[g], again.grads[g]):
                    repeatable = False
                    if params_differences is not None and g not in {d.param for d in params_differences}:
                        params_differences.append(param_difference(g, full.grads[g], again.grads[g]))
            alone = []
            for r in range(n):
                index = ctx.rows_index([r])
                alone.append(ctx.run_rows(inputs.select_rows(index), select_grad_outs(grad_outs, index)))
                ctx.progress(1)  # a row at a time: 2048 rows alone take seconds, a step to pause at
            ctx.settle()
            alone_outputs = _cat_outputs(alone)
            seed_fwd = int(_outputs_differ(full.outputs, alone_outputs).sum())
            stacked = {g: torch.cat([a.grads[g] for a in alone]) for g in ctx.row_grads}
            seed_rowgrad = sum(int(f.sum()) for f in _rowgrads_differ(ctx, full, stacked))
            if (seed_fwd or seed_rowgrad) and first is None:
                first = first_difference(pairs(ctx, full, alone_outputs, stacked), seed=seed, batch=n,
                                         positions=range(n), rows=range(n))
            fwd, rowgrad = fwd + seed_fwd, rowgrad + seed_rowgrad
        cases[str(n)] = AllRowsCase(rows=n * len(plan.seeds), fwd_differ=fwd, rowgrad_differ=rowgrad,
                                    first_difference=first)
    return cases, repeatable


def _locate_sub_batch(ctx: ProbeContext, inputs, grad_outs, full: Outcome, rows: range,
                      seed: int) -> Optional[Difference]:
    """Where the sub-batch `rows` differs from the same rows of the full batch (run again; None if this
    time it does not: a nondeterministic implementation)."""
    index = ctx.rows_index(rows)
    sub = ctx.run_rows(inputs.select_rows(index), select_grad_outs(grad_outs, index))
    ctx.settle()
    return first_difference(pairs(ctx, sub, *picked_at(ctx, full, index)), seed=seed, batch=len(rows),
                            positions=range(len(rows)), rows=rows)


def full_vs_sub_batches(ctx: ProbeContext, plan: SubBatchPlan) -> FullVsSubBatches:
    """Contiguous sub-batches of one large batch against the large batch; counts sub-batches that differ."""
    ctx = ctx.queued()
    count = fwd = rowgrad = 0
    first: Optional[Difference] = None
    for seed in plan.seeds:
        inputs, grad_outs = ctx.inputs(plan.full_batch, seed), ctx.grad_outs(plan.full_batch, seed)
        full = ctx.run(inputs, grad_outs)
        fwd_flags, grad_flags, any_flags, tried = [], [], [], []
        for size in plan.sub_batch_sizes:
            for start in plan.starts(size):
                rows = range(start, min(start + size, plan.full_batch))
                index = ctx.rows_index(rows)
                sub = ctx.run_rows(inputs.select_rows(index), select_grad_outs(grad_outs, index))
                picked, picked_grads = picked_at(ctx, full, index)
                fwd_flags.append(_outputs_differ(picked, sub.outputs).any())
                found = [rows_differ(picked_grads[g], sub.grads[g]).any() for g in ctx.row_grads]
                grad_flags += found
                any_flags.append(torch.stack([fwd_flags[-1], *found]).any())
                tried.append(rows)
                count += 1
                ctx.progress(1)
        ctx.settle()
        if first is None and any_flags:  # one read-back a seed; the first differing sub-batch run again
            differing = torch.stack(any_flags).nonzero()
            if differing.numel():
                rows = tried[int(differing[0, 0])]
                first = _locate_sub_batch(ctx, inputs, grad_outs, full, rows, seed)
        del full
        fwd += int(torch.stack(fwd_flags).sum())
        rowgrad += int(torch.stack(grad_flags).sum()) if grad_flags else 0
    return FullVsSubBatches(full_batch=plan.full_batch, sub_batch_sizes=list(plan.sub_batch_sizes),
                            sub_batches=count, fwd_differ=fwd, rowgrad_differ=rowgrad, first_difference=first)


def batch_size_sweep(ctx: ProbeContext, plan: SweepPlan) -> BatchSizeSweep:
    """Probe rows at the start, middle and end of batches of every size, filled with other rows in a
    seeded random order, and in the whole batch reversed; each against the probe row alone."""
    ctx = ctx.queued()
    sizes, probes = plan.batch_sizes(), plan.probe_rows()
    n = plan.rows
    labels: list[tuple[int, int, int, int]] = []  # (seed, batch, position, row) per comparison
    flags: list[torch.Tensor] = []
    orders: list[list[int]] = []  # each comparison's batch, to run a failing one again and locate it
    for seed in plan.seeds:
        inputs, grad_outs = ctx.inputs(n, seed), ctx.grad_outs(n, seed)
        gen = torch.Generator().manual_seed(seed)

        def run_rows(order: list[int]) -> Outcome:
            index = ctx.rows_index(order)
            return ctx.run_rows(inputs.select_rows(index), select_grad_outs(grad_outs, index))

        alone = {r: run_rows([r]) for r in probes}

        def compare(order: list[int], position: int, row: int) -> None:
            out = run_rows(order)
            at = slice(position, position + 1)
            pairs = [(o[at], a) for o, a in zip(out.outputs, alone[row].outputs)]
            pairs += [(out.grads[g][at], alone[row].grads[g]) for g in ctx.row_grads]
            flags.append(any_rows_differ(pairs).any())
            labels.append((seed, len(order), position, row))
            orders.append(order)

        for m in sizes:
            for r in probes:
                perm = torch.randperm(n, generator=gen)
                others = perm[perm != r][:m - 1].tolist()
                for position in plan.positions(m):
                    compare(others[:position] + [r] + others[position:], position, r)
                ctx.progress(len(plan.positions(m)))
        reversed_order = list(range(n - 1, -1, -1))
        for r in probes:
            compare(reversed_order, n - 1 - r, r)
        ctx.progress(len(probes))
    ctx.settle()
    differ = torch.stack(flags).cpu() if flags else torch.zeros(0, dtype=torch.bool)
    failed = differ.nonzero().flatten().tolist()
    first = [SweepFailure(*labels[i], difference=_locate_sweep(ctx, n, labels[i], orders[i]))
             for i in failed[:plan.max_failures]]
    return BatchSizeSweep(batch_sizes=sizes, probe_rows=probes, comparisons=len(labels),
                          differ=len(failed), first_failures=first)


def _locate_sweep(ctx: ProbeContext, n: int, label: tuple[int, int, int, int],
                  order: list[int]) -> Optional[Difference]:
    """A failing sweep comparison run again (the batch and the probe row alone) and located."""
    seed, _batch, position, row = label
    inputs, grad_outs = ctx.inputs(n, seed), ctx.grad_outs(n, seed)

    def run_rows(rows: list[int]) -> Outcome:
        index = ctx.rows_index(rows)
        return ctx.run_rows(inputs.select_rows(index), select_grad_outs(grad_outs, index))

    out, alone = run_rows(order), run_rows([row])
    ctx.settle()
    at = slice(position, position + 1)
    pairs = ([(name, o[at], a) for name, o, a in zip(ctx.op.outputs, out.outputs, alone.outputs)]
             + [(f"grad {g}", out.grads[g][at], alone.grads[g]) for g in ctx.row_grads])
    return first_difference(pairs, seed=seed, batch=len(order), positions=[position], rows=[row])


def invariant(cases: dict[str, AllRowsCase], repeatable: Optional[bool], subs: FullVsSubBatches,
              sweep: BatchSizeSweep) -> bool:
    """The verdict the counts give: nothing differed and the parameter gradients did not fail to repeat
    (also what `h3bench validate` holds a file's recorded verdict to)."""
    clean = (all(c.fwd_differ == 0 and c.rowgrad_differ == 0 for c in cases.values())
             and subs.fwd_differ == 0 and subs.rowgrad_differ == 0 and sweep.differ == 0)
    return clean and repeatable is not False


def verdict(cases: dict[str, AllRowsCase], repeatable: Optional[bool], subs: FullVsSubBatches,
            sweep: BatchSizeSweep, params_differences: Optional[list[ParamDifference]] = None,
            beyond: Optional[Mapping[str, Any]] = None) -> BatchInvariance:
    """`batch_invariant` is the RFC's verdict, from the RFC's probes only (so files compare with the prior
    art); the probes beyond them (`beyond`, their records by name) each carry their own flag."""
    return BatchInvariance(all_rows=cases, params_repeatable=repeatable, full_vs_sub_batches=subs,
                           batch_size_sweep=sweep, batch_invariant=invariant(cases, repeatable, subs, sweep),
                           params_differences=params_differences or None,
                           beyond_rfc={name: found for name, found in (beyond or {}).items() if found is not None})


def verdict_of(found: Mapping[str, Any]) -> BatchInvariance:
    """A row's record from what each of its probes found, by the probe's name: the RFC's verdict from its
    three, each probe beyond them that ran under its own key, in PROBES' order (harness/probes/registry.py)."""
    cases, repeatable, differences = found[ALL_ROWS.name]
    return verdict(cases, repeatable, found[FULL_VS_SUB_BATCHES.name], found[BATCH_SIZE_SWEEP.name], differences,
                   {spec.name: found[spec.name] for spec in beyond_rfc() if spec.name in found})


def _all_rows_found(ctx: ProbeContext, plan: AllRowsPlan):
    """all_rows as its specification runs it: (its cases, params_repeatable, the parameter gradients that did
    not repeat)."""
    differences: list[ParamDifference] = []
    cases, repeatable = all_rows(ctx, plan, differences)
    return cases, repeatable, differences


ALL_ROWS = ProbeSpec(name="all_rows", plan_table="all_rows", plan_type=AllRowsPlan, run=_all_rows_found,
                     total=lambda plan, _ctx: all_rows_total(plan), role=Role.RFC)
FULL_VS_SUB_BATCHES = ProbeSpec(name="full_vs_sub_batches", plan_table="full_vs_sub", plan_type=SubBatchPlan,
                                run=full_vs_sub_batches,
                                total=lambda plan, _ctx: sub_batches_total(plan), role=Role.RFC)
BATCH_SIZE_SWEEP = ProbeSpec(name="batch_size_sweep", plan_table="sweep", plan_type=SweepPlan,
                             run=batch_size_sweep,
                             total=lambda plan, _ctx: sweep_total(plan), role=Role.RFC)
