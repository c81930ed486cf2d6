"""The negative control: each run's proof that its plan can see a batch-variant row on this machine.

A determinism suite whose checks pass proves nothing unless the same checks fail a row that is known to be
wrong (vLLM's suite runs such a control). Per op, `h3bench run` puts the op's composition row
(`Op.composition_row`: `diffusers` for the RFC's ops, `torch` for the common ops; a user op's declared
composition, else its reference evaluated in the inputs' own dtype: an honest implementation that rounds as a
real one does, where float64 would hide one to three low bits under its cast) with a planted batch-size fault
(harness/control_fault.py) through the run's batch-invariance probes (all_rows, the sub-batches, the sweep; no
accuracy or latency), in the plain mode, once per run. The plan is *blind* on this machine when a check did not
see the fault: the forward or the row gradients of all_rows or of the sub-batches, or the sweep, counted
nothing. The record goes under the evidence file's `control` key, not under `results`, so no table,
comparison, gate or index takes it for a row.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Union

import torch

from h3bench.harness.adapter import Adapter, Loaded, from_function
from h3bench.harness.config import RunConfig
from h3bench.harness.control_fault import planted
from h3bench.harness.ops.base import Op
from h3bench.harness.ops.declared import DeclaredOp
from h3bench.harness.probes import batch_invariance as bi
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.schema import ControlResult, ControlSkipped, Evidence

# Where a run's control is measured (RunRequest.control): in this process; nowhere, recorded as skipped
# (--no-control); or in another process of the same run (a mode's child, a fan-out job), which records it.
HERE, SKIP, ELSEWHERE = "here", "skip", "elsewhere"
SKIPPED_BY_USER = "--no-control"
# `h3bench run`'s exit status when a plan is blind on this machine (0 ok, 1 a failed gate, 2 bad input).
BLIND_EXIT = 3

Record = Union[ControlResult, ControlSkipped]


def declared_composition(op: Op) -> Optional[Adapter]:
    """For a user op (harness/ops/declared.py), the composition it declares, else its reference evaluated in
    the inputs' own dtype; None for any other op (a built-in op's composition row comes from the caller's
    adapter registry: harness/ does not import adapters/)."""
    if not isinstance(op, DeclaredOp):
        return None
    fn, what = op.control_composition()
    return from_function(fn, name=op.composition_row, op=op.name, differentiable=op.differentiable,
                         source=what, constants=op.constants)


def unmeasured(where: str) -> Optional[ControlSkipped]:
    """The record of a control this process does not measure: skipped with --no-control, else none (another
    process of the run records it)."""
    if where not in (HERE, SKIP, ELSEWHERE):
        raise ValueError(f"the control runs {HERE!r}, {SKIP!r} or {ELSEWHERE!r}, not {where!r}")
    return ControlSkipped(skipped=SKIPPED_BY_USER) if where == SKIP else None


def probe_units(config: RunConfig) -> int:
    """The control's progress total: the three probes' units (as each row's)."""
    return sum(bi.totals(config).values())


def measure(op: Op, adapter: Optional[Adapter], config: RunConfig, device: torch.device,
            progress: Callable[[int], None] = lambda n: None) -> Record:
    """The control's record for `adapter`, the op's composition row (`Op.composition_row`), which the caller
    takes from its adapter registry (harness/ does not import adapters/), or a user op's declared composition.
    The composition's own failure (ImplementationError) propagates to the runner, which blames it as it blames
    a row; an op without a composition (None), or one that does not load, is recorded as skipped, with the
    reason."""
    adapter = adapter or declared_composition(op)
    if adapter is None:
        return ControlSkipped(skipped=f"op {op.name} has no {op.composition_row} row to plant the fault in (none "
                                       f"in the adapters the run was given)")
    started = time.perf_counter()
    loaded = adapter.try_load(device, config.inputs)
    if not isinstance(loaded, Loaded):
        return ControlSkipped(skipped=f"the {op.composition_row} row did not load: {loaded}")
    row_grads = [i.per_row and i.differentiable and i.name in adapter.grads for i in op.inputs]
    fn = planted(loaded.fn, [i.per_row for i in op.inputs], row_grads)
    ctx = ProbeContext(op=op, params=config.inputs, fn=fn, grads=adapter.grads, device=device,
                       reference_variant=op.name, progress=progress)
    cases, repeatable = bi.all_rows(ctx, config.all_rows)
    subs = bi.full_vs_sub_batches(ctx, config.full_vs_sub)
    sweep = bi.batch_size_sweep(ctx, config.sweep)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    record = ControlResult(source=f"{loaded.source}; planted fault: outputs and row gradients rounded by the "
                                  f"batch size (h3bench control)",
                           row_grads=list(ctx.row_grads), batch_invariance=bi.verdict(cases, repeatable, subs, sweep),
                           flagged=False, wall_s=round(time.perf_counter() - started, 3))
    record.flagged = flagged(record)
    return record


def checks(record: ControlResult) -> list[tuple[str, int, int]]:
    """(check, count that differed, of how many) for every check the control must be flagged by."""
    inv = record.batch_invariance
    grads = len(record.row_grads)
    rows = sum(c.rows for c in inv.all_rows.values())
    subs, sweep = inv.full_vs_sub_batches, inv.batch_size_sweep
    found = [("all_rows fwd", sum(c.fwd_differ for c in inv.all_rows.values()), rows)]
    if grads:
        found.append(("all_rows rowgrad", sum(c.rowgrad_differ for c in inv.all_rows.values()), rows * grads))
    found.append(("full_vs_sub_batches fwd", subs.fwd_differ, subs.sub_batches))
    if grads:
        found.append(("full_vs_sub_batches rowgrad", subs.rowgrad_differ, subs.sub_batches * grads))
    found.append(("batch_size_sweep", sweep.differ, sweep.comparisons))
    return found


def flagged(record: ControlResult) -> bool:
    """What `flagged` must say: every check counted a difference."""
    return all(differ > 0 for _, differ, _ in checks(record))


def blind(evidence: Evidence) -> bool:
    return isinstance(evidence.control, ControlResult) and not evidence.control.flagged


def summary_line(evidence: Evidence) -> Optional[str]:
    """One line for the run's summary: the counts that flagged the control, or that the plan is blind
    (which checks counted nothing, the device, the plan), or why there is no control; None: no record."""
    record = evidence.control
    if record is None:
        return None
    if isinstance(record, ControlSkipped):
        return f"control: skipped ({record.skipped})"
    counts = ", ".join(f"{name} {differ}/{total}" for name, differ, total in checks(record))
    if record.flagged:
        return f"control: flagged by {counts}"
    unseen = ", ".join(name for name, differ, _ in checks(record) if differ == 0)
    plan = "quick" if evidence.quick else "full"
    device = evidence.environment.gpu or evidence.environment.device or "this device"
    return (f"control: the {plan} plan is blind on this machine ({device}): the planted batch-size fault went "
            f"unseen by {unseen} ({counts}); its verdicts cannot show a batch-variant row (exit {BLIND_EXIT})")
