"""Accuracy against float64 per row count, and latency, every row timed in the same rounds.

Accuracy: max|out - ref| / max|ref|, the reference computed in float64 on the same rounded inputs; an op
with several outputs is judged on all of them together (docs/operators.md, "Common to all": "for accuracy, concatenated"). On
a GPU the caching allocator is filled with NaN first, so an output element the implementation never
writes shows up as NaN (an infinite error) instead of passing on stale memory.

Latency (`time_rows`), three figures, each timed per-sample synchronized (`<figure>_us`, the prior art's
method) and back to back (`<figure>_stream_us`), interleaved across rows (harness/timing.py):
- fwd: forward alone, no autograd graph.
- fwd_bwd: as the prior art timed it: fresh cloned leaves and an all-ones upstream gradient made
  inside the timed step.
- fwd_bwd_net: forward + backward only; leaves and the upstream gradient made before the sample.

On CUDA each figure is also timed as a CUDA graph (`<figure>_graph_us`): the same step captured once and
replayed, per-sample synchronized, so the figure is the step's device work without its host cost. Why the
replay does the eager step's work:
- fwd: the captured forward is the eager one's kernels; its output comes from the graph's pool.
- fwd_bwd_net: the eager sample starts with every leaf's .grad None (its setup), so its backward writes
  fresh gradients, no accumulation. The capture starts from that state too (the setup runs just before
  it), so it records the same kernels, and the gradients it allocates come from the graph's pool; each
  replay writes them there again. No setup runs between replays: the replay does not look at .grad, it
  repeats the recorded writes. The leaves and the all-ones upstream gradients are made before the capture
  and read in place.
- fwd_bwd: the fresh leaves' clones and the all-ones gradients are made inside the captured step, so their
  copy and fill kernels are replayed too, as the eager figure runs them; only their host cost is gone.
A row whose step cannot be captured or replayed (it synchronizes, calls .item(), copies from the CPU,
allocates outside the caching allocator...) gets the reason under `graph_unavailable[figure]`; its other
figures stay. What the replay cannot show: Python-side work of the implementation (it is not rerun).

Peak memory (`<figure>_peak_bytes`, CUDA only): one more call of the eager step after its synchronized
samples (harness/peak_memory.py). A no-grad call of h3bench's kernels that replays its own graph
(kernels/graph_cache.py) keeps its intermediates in that graph's pool, allocated before the step.
Once every size is timed, each size gets its memory floors from the rows that are still measured
(harness/floors.py): no floor is above any of their medians.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from h3bench.harness.config import AccuracyPlan, TimingPlan
from h3bench.harness.execute import (ImplementationError, blamed, call, describe_exception, device_usable, execute,
                                     make_leaves)
from h3bench.harness.floors import Rates, add_floors
from h3bench.harness.ops.base import Op, OpInputs
from h3bench.harness.peak_memory import Readers, peak_bytes
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.probes.registry import ProbeSpec, Role
from h3bench.harness.schema import FIGURES, SizeResult, Spread, latency_key, peak_key
from h3bench.harness.timing import (GRAPH, METHODS, STREAM, SYNCHRONIZED, GraphCapture, L2Flush, Subject, interleave,
                                    median, rounds_for, spread_of)

POISON_FACTOR = 8  # poison this many times the outputs' bytes of free cached memory


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref|; NaN or inf anywhere in `out` makes it infinite."""
    return combined_rel_err((out,), (ref,))


def combined_rel_err(outs: tuple[torch.Tensor, ...], refs: tuple[torch.Tensor, ...]) -> float:
    """max|out - ref| / max|ref| over all the tensors together (an op's outputs, concatenated)."""
    err = scale = 0.0
    for out, ref in zip(outs, refs):
        out64 = out.double()
        if not bool(torch.isfinite(out64).all()):
            return math.inf
        if ref.numel():
            scale = max(scale, ref.abs().max().item())
            err = max(err, (out64 - ref).abs().max().item())
    return err / scale if scale > 0 else err


def poison_cached_memory(device: torch.device, nbytes: int) -> None:
    """Fill free blocks of the CUDA caching allocator with 0xFF (NaN in bf16/fp16/fp32)."""
    if device.type != "cuda" or nbytes <= 0:
        return
    block = torch.empty(nbytes, dtype=torch.uint8, device=device)
    block.fill_(0xFF)
    del block


def accuracy(ctx: ProbeContext, plan: AccuracyPlan) -> dict[str, SizeResult]:
    """Errors per row count; latencies are filled in later by `time_rows`, with every row together."""
    results = {}
    for rows in plan.rows:
        results[str(rows)] = _errors(ctx, rows, plan)
        ctx.progress(1)
    return results


def _errors(ctx: ProbeContext, rows: int, plan: AccuracyPlan) -> SizeResult:
    inputs = ctx.inputs(rows, plan.input_seed)
    grad_outs = ctx.grad_outs(rows, plan.grad_seed)
    has_backward = bool(ctx.grads)
    poison_cached_memory(ctx.device, POISON_FACTOR * sum(g.numel() * g.element_size() for g in grad_outs))
    out = execute(ctx.fn, inputs, grad_outs if has_backward else None, ctx.grads, ctx.n_outputs)
    ref = ctx.reference(inputs, grad_outs if has_backward else None)
    _check_shapes(out.outputs, ref.outputs)
    result = SizeResult(fwd_rel_err=combined_rel_err(out.outputs, ref.outputs), fwd_us=math.nan)
    if has_backward:
        result.grad_rel_err = {name: rel_err(out.grads[name], ref.grads[name]) for name in ctx.grads}
    return result


def _check_shapes(outs, refs) -> None:
    for i, (out, ref) in enumerate(zip(outs, refs)):
        if out.shape != ref.shape:
            raise ImplementationError(f"implementation returned shape {tuple(out.shape)} for output {i}, "
                                      f"the reference has {tuple(ref.shape)}")


# --- latency ----------------------------------------------------------------------------------------

@dataclass
class TimedRow:
    """One row to time: its callable, the gradients it produces, and where its numbers go."""

    name: str
    fn: Callable
    grads: tuple[str, ...]
    sizes: dict[str, SizeResult]
    error: Optional[ImplementationError] = None


def latency_units(plan: AccuracyPlan, timing: TimingPlan, graph: bool = False) -> int:
    """Progress units of `time_rows`: one per round of each figure and method (`graph`: with the CUDA
    graph figures)."""
    methods = len(METHODS) + (1 if graph else 0)
    return len(plan.rows) * len(FIGURES) * methods * timing.repeats * rounds_for(timing.reps, timing.block)


# What a capture or a replay raises when the step does what a capture forbids: the implementation's own
# error (ImplementationError) or the capture's (torch raises RuntimeError for CUDA errors).
CAPTURE_ERRORS = (ImplementationError, RuntimeError)


def time_rows(op: Op, params: Any, rows: list[TimedRow], plan: AccuracyPlan, timing: TimingPlan,
              device: torch.device, rates: Optional[Rates],
              progress: Callable[[int], None] = lambda n: None, graph_capture: Optional[GraphCapture] = None,
              memory: Optional[Readers] = None) -> None:
    """Time every row's figures at every size, rows interleaved, then add the floors (none without
    `rates`, or for an op that declares no traffic). A row whose call fails here gets `error` set and its
    remaining figures skipped; the other rows go on, and only theirs count for the floors. `graph_capture`
    (None: no graph figures) captures a step for the `*_graph_us` figures; `memory` (None: no peak
    figures) reads the allocator for `*_peak_bytes`."""
    flush = L2Flush(device) if timing.flush_l2 else None
    methods = METHODS + ((GRAPH,) if graph_capture is not None else ())
    for size in plan.rows:
        inputs = op.make_inputs(params, size, plan.input_seed, device)
        for figure in FIGURES:
            for method in methods:
                subjects = _subjects(rows, figure, method, inputs, len(op.outputs), str(size), graph_capture,
                                     device)
                found = interleave(subjects, device, SYNCHRONIZED if method == GRAPH else method, timing.warmup,
                                   timing.reps, timing.repeats, timing.block,
                                   on_error=CAPTURE_ERRORS if method == GRAPH else ImplementationError,
                                   progress=progress, flush=None if method == STREAM else flush)
                for row in rows:
                    timed = found.get(row.name)
                    if timed is None:
                        continue
                    if timed.error is not None:
                        if method == GRAPH:
                            _graph_unavailable(row, row.sizes[str(size)], figure, timed.error, device)
                        else:
                            row.error = timed.error
                        continue
                    _record(row.sizes[str(size)], latency_key(figure, method == STREAM, method == GRAPH),
                            timed.samples)
                if method == SYNCHRONIZED and memory is not None:
                    _measure_peaks(rows, subjects, figure, str(size), memory)
                del subjects, found  # a captured graph's memory pool goes with it
        del inputs
    if rates is None or not op.declares_traffic:
        return
    for size in plan.rows:
        add_floors(op, params, size, {row.name: row.sizes[str(size)] for row in rows if row.error is None}, rates)


def _subjects(rows: list[TimedRow], figure: str, method: str, inputs: OpInputs, n_outputs: int, size: str,
              graph_capture: Optional[GraphCapture], device: torch.device) -> list[Subject]:
    """The rows' steps of one figure; for GRAPH each one captured (a row whose capture fails gets the
    reason in `graph_unavailable` and no subject)."""
    subjects = []
    for row in rows:
        if row.error is not None or not (figure == "fwd" or row.grads):
            continue
        try:
            subject = _subject(row, figure, inputs, n_outputs)
        except ImplementationError as exc:
            row.error = exc
            continue
        if method == GRAPH:
            try:
                subject = Subject(row.name, graph_capture(subject.step, subject.setup))
            except CAPTURE_ERRORS as exc:
                _graph_unavailable(row, row.sizes[size], figure, exc, device)
                continue
        subjects.append(subject)
    return subjects


def _failure_text(exc: BaseException) -> str:
    """An error as a row's reason; a capture that failed after the step's own error names both."""
    def text(e: BaseException) -> str:
        return str(e) if isinstance(e, ImplementationError) else describe_exception(e)
    inner = exc.__context__ if exc.__cause__ is None and not exc.__suppress_context__ else None
    return text(exc) if inner is None else f"{text(inner)}; then {text(exc)}"


def _graph_unavailable(row: TimedRow, result: SizeResult, figure: str, exc: BaseException,
                       device: torch.device) -> None:
    """Record why `figure` has no graph timing. A failed capture that left the CUDA context unusable is
    the row's failure: the runner then stops the rows after it (runner.DeviceLost)."""
    reason = _failure_text(exc)
    result.graph_unavailable = {**(result.graph_unavailable or {}), figure: reason}
    if not device_usable(device):
        row.error = ImplementationError(f"CUDA graph capture of {figure}: {reason}")


def _measure_peaks(rows: list[TimedRow], subjects: list[Subject], figure: str, size: str, memory: Readers) -> None:
    by_name = {row.name: row for row in rows}
    for subject in subjects:
        row = by_name[subject.key]
        if row.error is not None:
            continue
        try:
            setattr(row.sizes[size], peak_key(figure), peak_bytes(subject.step, memory, subject.setup))
        except ImplementationError as exc:
            row.error = exc


def _subject(row: TimedRow, figure: str, inputs: OpInputs, n_outputs: int) -> Subject:
    """The timed step of one figure. Only the implementation's own calls are inside `blamed`, and the
    steps carry no checks: at small sizes their host cost would be part of the figure."""
    fn = blamed(row.fn)
    run_backward = blamed(torch.autograd.backward)
    values = list(inputs.tensors.values())
    if figure == "fwd":
        def forward() -> None:
            with torch.no_grad():
                fn(*values)
        return Subject(row.name, forward)

    leaves = make_leaves(inputs, row.grads)
    with torch.no_grad():
        ones = [torch.ones_like(o) for o in call(row.fn, leaves, n_outputs)]

    def as_list(result) -> list[torch.Tensor]:
        return [result] if isinstance(result, torch.Tensor) else list(result)

    if figure == "fwd_bwd":
        grads, items = row.grads, list(inputs.tensors.items())

        def fresh_fwd_bwd() -> None:
            fresh = [t.detach().clone().requires_grad_() if name in grads else t for name, t in items]
            outs = as_list(fn(*fresh))
            run_backward(outs, [torch.ones_like(o) for o in outs])
        return Subject(row.name, fresh_fwd_bwd)

    def clear() -> None:
        for leaf in leaves:
            leaf.grad = None

    def net_fwd_bwd() -> None:
        run_backward(as_list(fn(*leaves)), ones)

    return Subject(row.name, net_fwd_bwd, setup=clear)


def _record(result: SizeResult, key: str, samples: list[list[float]]) -> None:
    setattr(result, key, median(samples[0]))
    spreads = result.spread if result.spread is not None else {}
    spreads[key] = _spread(samples[0])
    if len(samples) > 1:
        setattr(result, f"{key}_repeat", median(samples[1]))
        spreads[f"{key}_repeat"] = _spread(samples[1])
    result.spread = spreads


def _spread(values: list[float]) -> Spread:
    stats = spread_of(values)
    return Spread(p10=stats.p10, p50=stats.p50, p90=stats.p90, n=stats.n)


PROBE = ProbeSpec(name="accuracy_latency", plan_table="accuracy", plan_type=AccuracyPlan, run=accuracy,
                  total=lambda plan, _ctx: len(plan.rows), role=Role.ACCURACY)
