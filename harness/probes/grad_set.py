"""Grad-set invariance: a row's gradients must not depend on which parameter gradients are requested.

Users freeze parameters (a norm's weight, a modulation table: LoRA, adapters), so the same rows run with
only some parameters requiring a gradient. A kernel that takes another path then (a variant compiled
without the parameter sums, a reduction it skips and reorders, a fused kernel swapped for an unfused one)
can change the activations' gradients, which the RFC's probes never see: they always request every
gradient. Per seed the rows run once with every parameter gradient the row declares requested, then once
per proper subset: each parameter frozen in turn (the others requested) and none requested; the same
inputs and upstream gradients each time. Each run's per-row gradients are compared bitwise with the
all-requested run's.

Not applicable (recorded with the reason, no pass): a row that declares no parameter gradient, or no per-row
gradient to compare. An implementation that raises when a parameter is frozen records "rejects frozen
...: <reason>", which is not a difference.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from h3bench.harness.config import require
from h3bench.harness.execute import ImplementationError, Outcome, any_rows_differ, device_usable
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.probes.difference import first_difference
from h3bench.harness.probes.registry import ProbeSpec, Role
from h3bench.harness.probes.wording import case_detail, first_at, within
from h3bench.harness.schema import Difference, additive

@dataclass(frozen=True)
class GradSetPlan:
    rows: int
    seeds: tuple[int, ...]

    def __post_init__(self):
        require(self.rows >= 1, "rows must be >= 1")
        require(bool(self.seeds), "seeds must not be empty")


@dataclass
class GradSetCase:
    """The rows' per-row gradients (`tensors`) with only `requested` of the row's parameter gradients asked for
    (`frozen` not), against the same rows with every one asked for: `rowgrad_differ` of `rows` differ;
    `rejected`: the implementation refused to run so (not counted as a difference)."""

    frozen: list[str]
    requested: list[str]
    tensors: list[str]
    rows: int
    rowgrad_differ: int
    rejected: Optional[str] = additive()
    first_difference: Optional[Difference] = additive()


@dataclass
class GradSet:
    """Per frozen set (`frozen w`, ..., `none requested`) of the parameters whose gradients the row declares
    (`params`); `invariant`: no frozen set changed a per-row gradient's bits, None when the probe does not
    apply (`not_applicable` says why) or no frozen set ran."""

    rows: int
    seeds: list[int]
    params: list[str]
    cases: dict[str, GradSetCase]
    invariant: Optional[bool]
    not_applicable: Optional[str] = additive()


NONE_LABEL = "none requested"


def subsets(params: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The frozen sets the probe runs, in order: each parameter alone, then all of them (none requested);
    one parameter gives the one set."""
    frozen = [(p,) for p in params]
    if len(params) > 1:
        frozen.append(tuple(params))
    return frozen


def label(frozen: tuple[str, ...], params: tuple[str, ...]) -> str:
    """`frozen w` for one parameter frozen, `none requested` when every one is."""
    return NONE_LABEL if len(params) > 1 and set(frozen) == set(params) else f"frozen {', '.join(frozen)}"


def not_applicable_reason(ctx: ProbeContext) -> Optional[str]:
    if not ctx.param_grads:
        return "no parameter gradients: nothing to freeze"
    if not ctx.row_grads:
        return "no per-row gradients to compare"
    return None


def grad_set_total(plan: GradSetPlan, ctx: ProbeContext) -> int:
    """Progress units: one per run (the all-requested one and one per frozen set) per seed; none when the
    probe does not apply."""
    if not_applicable_reason(ctx) is not None:
        return 0
    return len(plan.seeds) * (1 + len(subsets(ctx.param_grads)))


def _requesting(ctx: ProbeContext, frozen: tuple[str, ...]) -> ProbeContext:
    """The context with the gradients of `frozen` not requested (the others in the row's order)."""
    return dataclasses.replace(ctx, grads=tuple(g for g in ctx.grads if g not in frozen))


def grad_set(ctx: ProbeContext, plan: GradSetPlan) -> GradSet:
    record = GradSet(rows=plan.rows, seeds=list(plan.seeds), params=list(ctx.param_grads), cases={},
                     invariant=None)
    reason = not_applicable_reason(ctx)
    if reason is not None:
        record.not_applicable = reason
        return record
    n = plan.rows
    params = ctx.param_grads
    tensors = [f"grad {g}" for g in ctx.row_grads]
    cases = {label(f, params): GradSetCase(frozen=list(f), requested=[p for p in params if p not in f],
                                           tensors=tensors, rows=0, rowgrad_differ=0)
             for f in subsets(params)}
    for seed in plan.seeds:
        inputs, grad_outs = ctx.inputs(n, seed), ctx.grad_outs(n, seed)
        every = ctx.run_rows(inputs, grad_outs)
        ctx.progress(1)
        for frozen in subsets(params):
            ctx.progress(1)
            case = cases[label(frozen, params)]
            if case.rejected is not None:
                continue
            try:
                got = _requesting(ctx, frozen).run_rows(inputs, grad_outs)
            except ImplementationError as exc:
                if not device_usable(ctx.device):
                    raise  # the context is gone: the runner stops the run (harness/runner.py)
                case.rejected = f"rejects {label(frozen, params)}: {exc}"
                continue
            _count(ctx, case, got, every, seed, n)
    record.cases = cases
    record.invariant = invariant(record)
    return record


def _count(ctx: ProbeContext, case: GradSetCase, got: Outcome, every: Outcome, seed: int, n: int) -> None:
    """Add the rows whose per-row gradients differ from the all-requested run's; keep the first one."""
    pairs = [(got.grads[g], every.grads[g]) for g in ctx.row_grads]
    differ = int(any_rows_differ(pairs).sum())
    case.rows += n
    case.rowgrad_differ += differ
    if differ and case.first_difference is None:
        case.first_difference = first_difference(
            [(f"grad {g}", got.grads[g], every.grads[g]) for g in ctx.row_grads], seed=seed, batch=n,
            positions=range(n), rows=range(n))


def invariant(record: GradSet) -> Optional[bool]:
    """False when a frozen set changed a per-row gradient's bits; None when the probe does not apply or no
    frozen set ran (every one rejected); also what `h3bench validate` holds the recorded flag to."""
    ran = [c for c in record.cases.values() if c.rows]
    if record.not_applicable is not None or not ran:
        return None
    return all(c.rowgrad_differ == 0 for c in ran)


def failures(record: GradSet, located: bool) -> list[str]:
    """The gate's lines: each frozen set that changed a per-row gradient's bits."""
    return [f"grad_set {name}: rowgrad {case.rowgrad_differ} of {case.rows} rows"
            f"{first_at(case.first_difference, located)}"
            for name, case in record.cases.items() if case.rowgrad_differ]


def problems(record: GradSet, where: str) -> list[str]:
    """Validate's: each frozen set's count within its rows."""
    return [line for name, case in record.cases.items()
            for line in within(f"{where}.cases.{name}", 0, case.rowgrad_differ, case.rows)]


def words(record: GradSet) -> tuple[str, str]:
    """The report's detail (why it does not apply, or each frozen set's count or rejection) and short count."""
    if record.not_applicable:
        return f"not applicable: {record.not_applicable}", ""
    parts = [case_detail(name, case.tensors, case.rowgrad_differ, case.rows, case.rejected, case.first_difference)
             for name, case in record.cases.items()]
    differ = sum(c.rowgrad_differ for c in record.cases.values())
    return "; ".join(parts), f"{differ}/{sum(c.rows for c in record.cases.values())}"


PROBE = ProbeSpec(
    name="grad_set", plan_table="grad_set", plan_type=GradSetPlan, run=grad_set, total=grad_set_total,
    role=Role.BEYOND_RFC, record_type=GradSet, invariant=invariant, failures=failures, problems=problems,
    words=words, label="grad set",
    note="the rows' per-row gradients with each parameter frozen in turn and with none requested, against every "
         "parameter gradient requested")
