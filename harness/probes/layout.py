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

from typing import Callable

import torch

from h3bench.harness.config import LayoutPlan
from h3bench.harness.execute import ImplementationError, bitwise_equal, device_usable
from h3bench.harness.ops.base import OpInputs
from h3bench.harness.probes.comparison import Compared, Tally
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.schema import LayoutCase, Layouts


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
