"""Layout: the same rows fed as strided views must give the contiguous bits (outputs and per-row gradients).

In a model a row tensor is rarely a fresh contiguous block: it is a slice of a larger batch (a storage
offset), a padded buffer (a row stride above the hidden size) or a transposed product (column-major). A
kernel that takes a slow path for such a view, or copies it and sums in another order, gives other bits for
the same rows. Per seed the rows run once contiguous, then once per layout with the per-row inputs that can
take it laid out so (the upstream gradients and the shared parameters as they are):

- `row_offset`: rows offset_rows .. offset_rows + n of a larger tensor (every per-row input);
- `padded_rows`: big[:, :H] of a buffer twice as wide (per-row inputs of two or more dimensions);
- `column_major`: x.t().contiguous().t() (two-dimensional per-row inputs).

The filler around the rows is the rows' own values shifted by one row, so a kernel that reads past its
view reads plausible numbers of the right dtype (and valid indices) and gives other bits. An implementation
that raises on a layout records "rejects <layout>: <reason>", which is not a difference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from h3bench.harness.config import require
from h3bench.harness.execute import ImplementationError, bitwise_equal, device_usable
from h3bench.harness.ops.base import OpInputs
from h3bench.harness.probes.comparison import Compared, Tally
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.probes.registry import ProbeSpec, Role
from h3bench.harness.probes.wording import case_detail, failure_line, within
from h3bench.harness.schema import Difference, additive


@dataclass(frozen=True)
class LayoutPlan:
    rows: int
    seeds: tuple[int, ...]
    offset_rows: int   # row_offset: the rows start this many rows into a larger tensor

    def __post_init__(self):
        require(self.rows >= 1 and self.offset_rows >= 1, "rows and offset_rows must be >= 1")
        require(bool(self.seeds), "seeds must not be empty")


@dataclass
class LayoutCase:
    """The rows fed with the per-row inputs `tensors` as strided views, against the contiguous bits;
    `rejected`: the implementation refused the layout (not counted as a difference)."""

    tensors: list[str]
    rows: int
    fwd_differ: int
    rowgrad_differ: int
    rejected: Optional[str] = additive()
    first_difference: Optional[Difference] = additive()


@dataclass
class Layouts:
    """Per layout (`row_offset`, `padded_rows`, `column_major`; those no per-row input can take are left
    out); `invariant`: no accepted layout changed a bit."""

    rows: int
    seeds: list[int]
    offset_rows: int
    cases: dict[str, LayoutCase]
    invariant: bool


def _filler(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`rows` rows of plausible values: t's rows shifted by one, repeated as needed."""
    shifted = t.roll(1, 0)
    return shifted.repeat(-(-rows // t.shape[0]), *[1] * (t.dim() - 1))[:rows]


def row_offset(t: torch.Tensor, offset_rows: int) -> torch.Tensor:
    big = torch.cat([_filler(t, offset_rows), t, _filler(t, 1)])
    return big[offset_rows:offset_rows + t.shape[0]]


def padded_rows(t: torch.Tensor, _offset_rows: int) -> torch.Tensor:
    return torch.cat([t, t.roll(1, 0)], dim=1)[:, :t.shape[1]]


def column_major(t: torch.Tensor, _offset_rows: int) -> torch.Tensor:
    return t.t().contiguous().t()


# layout -> (the per-row inputs it applies to, how a tensor is laid out so)
LAYOUTS: dict[str, tuple[Callable[[torch.Tensor], bool], Callable[[torch.Tensor, int], torch.Tensor]]] = {
    "row_offset": (lambda t: t.dim() >= 1, row_offset),
    "padded_rows": (lambda t: t.dim() >= 2, padded_rows),
    "column_major": (lambda t: t.dim() == 2 and t.shape[0] > 1 and t.shape[1] > 1, column_major),
}


def applicable(ctx: ProbeContext, rows: int) -> dict[str, list[str]]:
    """Per layout, the per-row inputs of the op it applies to (judged on a batch of `rows` rows); layouts
    that apply to none are left out."""
    inputs = ctx.inputs(rows, 0)
    found = {name: [n for n in inputs.row_names if applies(inputs.tensors[n])]
             for name, (applies, _) in LAYOUTS.items()}
    return {name: tensors for name, tensors in found.items() if tensors}


def layout_total(plan: LayoutPlan, layouts: int) -> int:
    """Progress units: one per run (the contiguous one and one per layout) per seed."""
    return len(plan.seeds) * (1 + layouts)


def _laid_out(inputs: OpInputs, tensors: list[str], make, offset_rows: int) -> OpInputs:
    laid = {name: (make(t, offset_rows) if name in tensors else t) for name, t in inputs.tensors.items()}
    for name in tensors:  # the view must hold the same values: otherwise the probe itself is wrong
        if not bitwise_equal(laid[name].contiguous(), inputs.tensors[name]):
            raise RuntimeError(f"layout of {name!r} changed its values")
    return OpInputs(tensors=laid, row_names=inputs.row_names)


def layout(ctx: ProbeContext, plan: LayoutPlan) -> Layouts:
    n = plan.rows
    which = applicable(ctx, n)
    tallies = {name: Tally() for name in which}
    rejected: dict[str, str] = {}
    for seed in plan.seeds:
        inputs, grad_outs = ctx.inputs(n, seed), ctx.grad_outs(n, seed)
        contiguous = ctx.run_rows(inputs, grad_outs)
        ctx.progress(1)
        for name, tensors in which.items():
            ctx.progress(1)
            if name in rejected:
                continue
            laid = _laid_out(inputs, tensors, LAYOUTS[name][1], plan.offset_rows)
            try:
                got = ctx.run_rows(laid, grad_outs)
            except ImplementationError as exc:
                if not device_usable(ctx.device):
                    raise  # the context is gone: the runner stops the run (harness/runner.py)
                rejected[name] = f"rejects {name}: {exc}"
                continue
            tallies[name].add(ctx, [Compared(got=got, want_outputs=contiguous.outputs, want_grads=contiguous.grads,
                                             batch=n, positions=range(n), rows=range(n))], seed)
    cases = {name: LayoutCase(tensors=which[name], rows=t.rows, fwd_differ=t.fwd_differ,
                              rowgrad_differ=t.rowgrad_differ, rejected=rejected.get(name),
                              first_difference=t.first_difference)
             for name, t in tallies.items()}
    record = Layouts(rows=n, seeds=list(plan.seeds), offset_rows=plan.offset_rows, cases=cases, invariant=False)
    record.invariant = invariant(record)
    return record


def invariant(record: Layouts) -> bool:
    """No accepted layout changed a bit (also what `h3bench validate` holds the recorded flag to)."""
    return all(c.fwd_differ == 0 and c.rowgrad_differ == 0 for c in record.cases.values())


def failures(record: Layouts, located: bool) -> list[str]:
    """The gate's lines: each accepted layout that changed a bit."""
    return [failure_line(f"layout {label}", case.fwd_differ, case.rowgrad_differ, case.rows, case.first_difference,
                         located)
            for label, case in record.cases.items() if case.fwd_differ or case.rowgrad_differ]


def problems(record: Layouts, where: str) -> list[str]:
    """Validate's: each layout's counts within its rows."""
    return [line for label, case in record.cases.items()
            for line in within(f"{where}.cases.{label}", case.fwd_differ, case.rowgrad_differ, case.rows)]


def words(record: Layouts) -> tuple[str, str]:
    """The report's detail (each layout's counts, or its rejection) and short count."""
    parts = [case_detail(name, case.tensors, case.fwd_differ + case.rowgrad_differ, case.rows, case.rejected,
                         case.first_difference) for name, case in record.cases.items()]
    differ = sum(c.fwd_differ + c.rowgrad_differ for c in record.cases.values())
    return ("; ".join(parts) or "no per-row input takes a strided layout",
            f"{differ}/{sum(c.rows for c in record.cases.values())}")


PROBE = ProbeSpec(
    name="layout", plan_table="layout", plan_type=LayoutPlan, run=layout,
    total=lambda plan, ctx: layout_total(plan, len(applicable(ctx, plan.rows))), role=Role.BEYOND_RFC,
    record_type=Layouts, invariant=invariant, failures=failures, problems=problems, words=words,
    label="layout", note="the rows as strided views (a row offset, padded rows, column-major) against the "
                         "contiguous bits")
