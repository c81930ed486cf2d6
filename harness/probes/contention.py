"""Contention: a row's batch-invariance comparisons repeated while a side load keeps the device busy.

Real kernels pick split counts from the SMs they find free, let an autotuner's timing choose a path, or
spin on a flag another workload sets; such a kernel passes every idle probe and changes its bits in a
serving process. Per seed, one pass idle: the batch (twice: its parameter gradients must repeat), each
row alone and each sub-batch, the rows alone and sub-batches against the batch (the RFC's comparisons at a
smaller size). Then the same runs (the batch once) under each load of harness/probes/side_load.py, every
run against the same run idle, bitwise, the batch's parameter gradients against the idle ones. Each load records how many of
its iterations ran while the probe did and how many of the row's runs found it busy, so a load that did
not overlap the row's kernels shows as such instead of as a pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from h3bench.harness.config import require
from h3bench.harness.execute import Outcome, bitwise_equal
from h3bench.harness.probes.comparison import Compared, Tally, picked
from h3bench.harness.probes.context import ProbeContext, select_grad_outs
from h3bench.harness.probes.difference import param_difference
from h3bench.harness.probes.registry import ProbeSpec, Role, Turn
from h3bench.harness.probes.side_load import LOADS, SideLoad
from h3bench.harness.probes.wording import differ_count, failure_line, first_where, within
from h3bench.harness.schema import Difference, ParamDifference, additive


@dataclass(frozen=True)
class ContentionPlan:
    rows: int          # the batch: each row alone and sub-batches of `sub_batch` rows against it
    sub_batch: int
    seeds: tuple[int, ...]
    copy_mib: int      # the memory load copies a buffer of this many MiB, again and again
    matmul_dim: int    # the compute load multiplies square matrices of this size, again and again

    def __post_init__(self):
        require(self.rows >= 1 and 1 <= self.sub_batch <= self.rows, "rows must be >= 1, sub_batch 1..rows")
        require(bool(self.seeds), "seeds must not be empty")
        require(self.copy_mib >= 1 and self.matmul_dim >= 1, "copy_mib and matmul_dim must be >= 1")

    def sub_batches(self) -> list[range]:
        return [range(s, min(s + self.sub_batch, self.rows)) for s in range(0, self.rows, self.sub_batch)]


@dataclass
class ContentionCase:
    """One pass of the probe, counted in rows. Idle: each row
    alone and each sub-batch against the batch, the batch twice for its parameter gradients. Under a load:
    the batch, each row alone and each sub-batch against the same run idle, the batch's parameter gradients
    against the idle ones;
    `iterations` of the load ran while the probe did, and `overlapped` of its `runs` found the load busy."""

    comparisons: int
    fwd_differ: int
    rowgrad_differ: int
    params_repeatable: Optional[bool]
    first_difference: Optional[Difference] = additive()
    params_differences: Optional[list[ParamDifference]] = additive()
    iterations: Optional[int] = additive()
    runs: Optional[int] = additive()
    overlapped: Optional[int] = additive()


@dataclass
class Contention:
    """The rows' comparisons repeated while a side load keeps the device busy (`loads`: `memory`, large
    copies; `compute`, large matmuls), beside the same comparisons idle; `invariant`: nothing differed."""

    rows: int
    sub_batch: int
    seeds: list[int]
    idle: ContentionCase
    loads: dict[str, ContentionCase]
    invariant: bool


def contention_total(plan: ContentionPlan) -> int:
    """Progress units: one per run of the row, idle (the batch twice) and under each load (the batch once)."""
    per_pass = plan.rows + len(plan.sub_batches()) + 1
    return len(plan.seeds) * ((per_pass + 1) + len(LOADS) * per_pass)


@dataclass
class _Pass:
    batch: Outcome           # with the parameter gradients
    again: Optional[Outcome]  # idle: the batch run again, when the row has parameter gradients
    alone: list[Outcome]
    subs: list[Outcome]


class _Watch:
    """Runs the row under a load (or idle when `load` is None), counting the runs that found it busy."""

    def __init__(self, load: Optional[SideLoad]):
        self.load, self.runs, self.overlapped = load, 0, 0

    def __call__(self, run: Callable[[], Outcome]) -> Outcome:
        if self.load is None:
            return run()
        busy, before = self.load.wait_busy(), self.load.iterations
        out = run()
        self.runs += 1
        self.overlapped += int(busy and (self.load.iterations > before or self.load.busy()))
        return out


def _run_pass(ctx: ProbeContext, plan: ContentionPlan, inputs, grad_outs, watch: _Watch, again: bool) -> _Pass:
    def rows_of(rows) -> Outcome:
        index = ctx.rows_index(rows)
        return watch(lambda: ctx.run_rows(inputs.select_rows(index), select_grad_outs(grad_outs, index)))

    batch = watch(lambda: ctx.run(inputs, grad_outs))
    repeat = watch(lambda: ctx.run(inputs, grad_outs)) if again and ctx.param_grads else None
    ctx.progress(2 if again else 1)
    alone = [rows_of([r]) for r in range(plan.rows)]
    ctx.progress(plan.rows)
    subs = [rows_of(rows) for rows in plan.sub_batches()]
    ctx.progress(len(subs))
    return _Pass(batch=batch, again=repeat, alone=alone, subs=subs)


class _Case:
    """A pass's counts over the seeds."""

    def __init__(self):
        self.tally = Tally()
        self.repeatable: Optional[bool] = None
        self.params: list[ParamDifference] = []

    def params_against(self, ctx: ProbeContext, want: Outcome, *got: Optional[Outcome]) -> None:
        if not ctx.param_grads:
            return
        self.repeatable = True if self.repeatable is None else self.repeatable
        for outcome in (g for g in got if g is not None):
            for name in ctx.param_grads:
                if not bitwise_equal(outcome.grads[name], want.grads[name]):
                    self.repeatable = False
                    if name not in {p.param for p in self.params}:
                        self.params.append(param_difference(name, outcome.grads[name], want.grads[name]))

    def record(self, watch: Optional[_Watch] = None, iterations: Optional[int] = None) -> ContentionCase:
        t = self.tally
        return ContentionCase(comparisons=t.rows, fwd_differ=t.fwd_differ, rowgrad_differ=t.rowgrad_differ,
                              params_repeatable=self.repeatable, first_difference=t.first_difference,
                              params_differences=self.params or None, iterations=iterations,
                              runs=watch.runs if watch else None, overlapped=watch.overlapped if watch else None)


def _idle_compared(ctx: ProbeContext, plan: ContentionPlan, idle: _Pass) -> list[Compared]:
    n = plan.rows
    out = [Compared(got=_rows_of(ctx, idle.batch, [r]), want_outputs=o.outputs, want_grads=o.grads, batch=n,
                    positions=[r], rows=[r]) for r, o in enumerate(idle.alone)]
    for rows, sub in zip(plan.sub_batches(), idle.subs):
        want_outputs, want_grads = picked(ctx, idle.batch, rows)
        out.append(Compared(got=sub, want_outputs=want_outputs, want_grads=want_grads, batch=len(rows),
                            positions=range(len(rows)), rows=rows))
    return out


def _rows_of(ctx: ProbeContext, full: Outcome, rows) -> Outcome:
    outputs, grads = picked(ctx, full, rows)
    return Outcome(outputs=outputs, grads=grads)


def _loaded_compared(plan: ContentionPlan, loaded: _Pass, idle: _Pass) -> list[Compared]:
    n = plan.rows
    out = [Compared(got=loaded.batch, want_outputs=idle.batch.outputs, want_grads=idle.batch.grads, batch=n,
                    positions=range(n), rows=range(n))]
    out += [Compared(got=got, want_outputs=want.outputs, want_grads=want.grads, batch=1, positions=[0], rows=[r])
            for r, (got, want) in enumerate(zip(loaded.alone, idle.alone))]
    out += [Compared(got=got, want_outputs=want.outputs, want_grads=want.grads, batch=len(rows),
                     positions=range(len(rows)), rows=rows)
            for rows, got, want in zip(plan.sub_batches(), loaded.subs, idle.subs)]
    return out


def contention(ctx: ProbeContext, plan: ContentionPlan) -> Contention:
    idle_case = _Case()
    cases = {kind: _Case() for kind in LOADS}
    watches = {kind: _Watch(None) for kind in LOADS}
    iterations = {kind: 0 for kind in LOADS}
    for seed in plan.seeds:
        inputs, grad_outs = ctx.inputs(plan.rows, seed), ctx.grad_outs(plan.rows, seed)
        idle = _run_pass(ctx, plan, inputs, grad_outs, _Watch(None), again=True)
        idle_case.tally.add(ctx, _idle_compared(ctx, plan, idle), seed)
        idle_case.params_against(ctx, idle.batch, idle.again)
        for kind in LOADS:
            with SideLoad(kind, ctx.device, plan.copy_mib, plan.matmul_dim) as load:
                watch = watches[kind]
                watch.load = load
                loaded = _run_pass(ctx, plan, inputs, grad_outs, watch, again=False)
                iterations[kind] += load.iterations  # the load runs only around this pass
            watch.load = None
            cases[kind].tally.add(ctx, _loaded_compared(plan, loaded, idle), seed)
            cases[kind].params_against(ctx, idle.batch, loaded.batch)
            del loaded
    loads = {kind: cases[kind].record(watches[kind], iterations[kind]) for kind in LOADS}
    record = Contention(rows=plan.rows, sub_batch=plan.sub_batch, seeds=list(plan.seeds), idle=idle_case.record(),
                        loads=loads, invariant=False)
    record.invariant = invariant(record)
    return record


def _clean(case: ContentionCase) -> bool:
    return case.fwd_differ == 0 and case.rowgrad_differ == 0 and case.params_repeatable is not False


def invariant(record: Contention) -> bool:
    """What the counts say (also what `h3bench validate` holds the recorded flag to)."""
    return all(_clean(c) for c in (record.idle, *record.loads.values()))


def _passes(record: Contention) -> list[tuple[str, ContentionCase]]:
    return [("idle", record.idle), *record.loads.items()]


def failures(record: Contention, located: bool) -> list[str]:
    """The gate's lines: each pass whose rows or parameter gradients differed."""
    found = []
    for label, case in _passes(record):
        what = f"contention {label}" if label == "idle" else f"contention under the {label} load"
        if case.fwd_differ or case.rowgrad_differ:
            found.append(failure_line(what, case.fwd_differ, case.rowgrad_differ, case.comparisons,
                                      case.first_difference, located))
        if case.params_repeatable is False:
            found.append(f"{what}: parameter gradients differ from idle" if label != "idle" else
                         f"{what}: parameter gradients not repeatable")
    return found


def problems(record: Contention, where: str) -> list[str]:
    """Validate's: each pass's counts within its comparisons, a load's busy runs within its runs."""
    found = []
    for label, case in _passes(record):
        path = f"{where}.{label if label == 'idle' else 'loads.' + label}"
        found += within(path, case.fwd_differ, case.rowgrad_differ, case.comparisons)
        if case.runs is not None and not 0 <= (case.overlapped or 0) <= case.runs:
            found.append(f"{path}.overlapped: {case.overlapped} not within 0..{case.runs}")
    return found


def words(record: Contention) -> tuple[str, str]:
    """The report's detail (each pass's counts, how busy each load kept the device) and short count."""
    parts, differ, total = [], 0, 0
    for label, case in _passes(record):
        text = f"{label}: {differ_count(case.fwd_differ + case.rowgrad_differ, case.comparisons, 'rows')}"
        if case.params_repeatable is False:
            text += ", parameter gradients " + ("not repeatable" if label == "idle" else "differ from idle")
        if case.runs is not None:
            text += f" ({case.iterations} load iterations, load busy in {case.overlapped}/{case.runs} runs)"
        parts.append(text + first_where(case.first_difference))
        differ, total = differ + case.fwd_differ + case.rowgrad_differ, total + case.comparisons
    return "; ".join(parts), f"{differ}/{total}"


PROBE = ProbeSpec(
    name="contention", plan_table="contention", plan_type=ContentionPlan, run=contention,
    total=lambda plan, _ctx: contention_total(plan), role=Role.BEYOND_RFC, turn=Turn.EXCLUSIVE,
    record_type=Contention, invariant=invariant, failures=failures, problems=problems, words=words,
    label="contention", note="the rows' comparisons repeated under a memory-bound and a compute-bound side load, "
                             "each run against the same run idle")
