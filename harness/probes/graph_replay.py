"""Graph replay: the row captured once in a CUDA graph and replayed with other inputs must give eager's bits.

Serving stacks capture a model's step in a CUDA graph and replay it with new inputs copied into the static
ones. A graph keeps everything the host decided at capture: a size, a split or a pointer read from a Python
global, a path an autotuner picked. Here the forward (no grad), and the forward with its backward
(`torch.autograd.grad` against upstream gradients that are static inputs too) where the row has gradients,
are each captured once on inputs of `capture_seed`; for each replay seed that seed's inputs and upstream
gradients are copied in, the graph replayed, and its outputs (and per-row gradients) compared bitwise with
an eager run on the same inputs. A row that cannot be captured records why (its exception, one line): not
being capturable is no batch-invariance failure. CUDA only: on another device the probe is recorded as not
run, with the reason.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from h3bench.harness.config import require
from h3bench.harness.execute import (ImplementationError, Outcome, as_outputs, describe_exception, device_usable,
                                     make_leaves)
from h3bench.harness.probes.comparison import Compared, Tally
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.probes.registry import ProbeSpec, Role
from h3bench.harness.probes.wording import differ_count, failure_line, first_where, within
from h3bench.harness.schema import Difference, additive


@dataclass(frozen=True)
class GraphReplayPlan:
    rows: int
    capture_seed: int
    replay_seeds: tuple[int, ...]  # inputs copied into the captured graph's, one replay each

    def __post_init__(self):
        require(self.rows >= 1, "rows must be >= 1")
        require(bool(self.replay_seeds), "replay_seeds must not be empty")


@dataclass
class GraphCapture:
    """The row's forward (or forward+backward) captured once in a CUDA graph and replayed with other inputs
    copied in, against eager runs on those inputs; `reason`: why it could not be captured (no failure)."""

    captured: bool
    replays: int
    rows: int
    fwd_differ: int
    rowgrad_differ: int
    reason: Optional[str] = additive()
    first_difference: Optional[Difference] = additive()


@dataclass
class GraphReplay:
    """`invariant`: every replay gave the eager bits; None when the probe did not run (`not_run` says why)
    or nothing could be captured."""

    rows: int
    capture_seed: int
    replay_seeds: list[int]
    invariant: Optional[bool]
    not_run: Optional[str] = additive()
    forward: Optional[GraphCapture] = additive()
    forward_backward: Optional[GraphCapture] = additive()


Step = Callable[[], tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]]
# capture(step) -> replay: runs the captured work again on whatever the static inputs hold now and returns
# step's (static) results
Capture = Callable[[Step], Callable[[], tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]]]
WARMUP = 2  # eager runs on a side stream before the capture, as torch.cuda.graphs asks (lazy init, workspaces)


def cuda_graph_capture(step: Step) -> Callable:
    """`step` warmed up on a side stream, then captured in a torch.cuda.CUDAGraph; the replay function."""
    stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            step()
    stream.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()

    def replay():
        graph.replay()
        torch.cuda.current_stream().synchronize()
        return result

    replay.graph = graph  # the graph (and its memory pool) lives as long as the replay function
    return replay


def graph_total(plan: GraphReplayPlan, device: torch.device) -> int:
    """Progress units: one per replay compared, for the forward and the forward+backward (none off CUDA)."""
    return 2 * len(plan.replay_seeds) if device.type == "cuda" else 0


def not_run_reason(device: torch.device) -> str:
    return f"CUDA graphs need a CUDA device; this run is on {device.type}"


def graph_replay(ctx: ProbeContext, plan: GraphReplayPlan, capture: Optional[Capture] = None) -> GraphReplay:
    """The probe; `capture` defaults to CUDA graphs (the probe then runs on CUDA only)."""
    record = GraphReplay(rows=plan.rows, capture_seed=plan.capture_seed, replay_seeds=list(plan.replay_seeds),
                         invariant=None)
    if capture is None:
        if ctx.device.type != "cuda":
            record.not_run = not_run_reason(ctx.device)
            return record
        capture = cuda_graph_capture
    record.forward = _case(ctx, plan, capture, backward=False)
    ctx.progress(len(plan.replay_seeds))
    if ctx.grads:
        record.forward_backward = _case(ctx, plan, capture, backward=True)
    ctx.progress(len(plan.replay_seeds))
    record.invariant = invariant(record)
    return record


def invariant(record: GraphReplay) -> Optional[bool]:
    """False when a replay differed from eager; None when nothing was captured and compared (also what
    `h3bench validate` holds the recorded flag to)."""
    cases = [c for c in (record.forward, record.forward_backward) if c is not None and c.captured and c.replays]
    if not cases:
        return None
    return all(c.fwd_differ == 0 and c.rowgrad_differ == 0 for c in cases)


def _case(ctx: ProbeContext, plan: GraphReplayPlan, capture: Capture, backward: bool) -> GraphCapture:
    n = plan.rows
    static = ctx.inputs(n, plan.capture_seed)
    static_grad_outs = ctx.grad_outs(n, plan.capture_seed) if backward else None
    grads = ctx.grads if backward else ()
    leaves = dict(zip(static.tensors, make_leaves(static, grads)))
    step = _step(ctx, list(leaves.values()), [leaves[g] for g in grads], grads, static_grad_outs)
    try:
        replay = capture(step)
    except Exception as exc:
        return _not_captured(ctx, f"cannot capture: {describe_exception(exc)}")
    tally, replays = Tally(), 0
    for seed in plan.replay_seeds:
        new = ctx.inputs(n, seed)
        new_grad_outs = ctx.grad_outs(n, seed) if backward else None
        with torch.no_grad():
            for name, t in new.tensors.items():
                leaves[name].copy_(t)
            for static_g, g in zip(static_grad_outs or (), new_grad_outs or ()):
                static_g.copy_(g)
        try:
            outputs, found = replay()
        except Exception as exc:
            return _not_captured(ctx, f"cannot replay: {describe_exception(exc)}")
        eager = ctx.run(new, new_grad_outs)
        got = Outcome(outputs=outputs, grads={g: found[g] for g in ctx.row_grads if g in found})
        want_grads = {g: eager.grads[g] for g in got.grads}
        if backward:
            tally.add(ctx, [Compared(got=got, want_outputs=eager.outputs, want_grads=want_grads, batch=n,
                                     positions=range(n), rows=range(n))], seed)
        else:
            tally.add(_forward_only(ctx), [Compared(got=got, want_outputs=eager.outputs, want_grads={}, batch=n,
                                                    positions=range(n), rows=range(n))], seed)
        replays += 1
    return GraphCapture(captured=True, replays=replays, rows=tally.rows, fwd_differ=tally.fwd_differ,
                        rowgrad_differ=tally.rowgrad_differ, first_difference=tally.first_difference)


def _forward_only(ctx: ProbeContext) -> ProbeContext:
    """The context with no gradients asked: what the forward's comparison looks through."""
    return dataclasses.replace(ctx, grads=())


def _step(ctx: ProbeContext, args: list[torch.Tensor], wanted: list[torch.Tensor], grads: tuple[str, ...],
          grad_outs: Optional[tuple[torch.Tensor, ...]]) -> Step:
    """The row's work on the static tensors: the forward, and with `grad_outs` the gradients of `grads`."""
    def step():
        with torch.set_grad_enabled(grad_outs is not None):
            outputs = as_outputs(ctx.fn(*args), ctx.n_outputs)
            if grad_outs is None:
                return tuple(o.detach() for o in outputs), {}
            pairs = [(o, g) for o, g in zip(outputs, grad_outs) if o.requires_grad]
            if not pairs:
                raise ImplementationError("implementation declares gradients but its outputs do not require grad")
            found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs])
            return tuple(o.detach() for o in outputs), dict(zip(grads, found))
    return step


def _not_captured(ctx: ProbeContext, reason: str) -> GraphCapture:
    if not device_usable(ctx.device):
        raise ImplementationError(f"{reason}; it left the CUDA context unusable")
    return GraphCapture(captured=False, replays=0, rows=0, fwd_differ=0, rowgrad_differ=0, reason=reason)


def _cases(record: GraphReplay) -> list[tuple[str, GraphCapture]]:
    return [(label, case) for label, case in (("forward", record.forward),
                                              ("forward_backward", record.forward_backward)) if case is not None]


def failures(record: GraphReplay, located: bool) -> list[str]:
    """The gate's lines: each capture whose replays differed from eager."""
    return [failure_line(f"graph_replay {label}", case.fwd_differ, case.rowgrad_differ, case.rows,
                         case.first_difference, located)
            for label, case in _cases(record) if case.fwd_differ or case.rowgrad_differ]


def problems(record: GraphReplay, where: str) -> list[str]:
    """Validate's: each capture's counts within its rows."""
    return [line for label, case in _cases(record)
            for line in within(f"{where}.{label}", case.fwd_differ, case.rowgrad_differ, case.rows)]


def _case_words(label: str, case: GraphCapture) -> str:
    if not case.captured:
        return f"{label}: {case.reason}"
    return (f"{label}: {differ_count(case.fwd_differ + case.rowgrad_differ, case.rows, 'rows')} in {case.replays} "
            f"replays{first_where(case.first_difference)}")


def words(record: GraphReplay) -> tuple[str, str]:
    """The report's detail (why it did not run, or each capture's counts) and short count."""
    if record.not_run:
        return f"not run: {record.not_run}", ""
    cases = _cases(record)
    detail = "; ".join(_case_words(label.replace("_", "+"), case) for label, case in cases)  # forward+backward
    differ = sum(c.fwd_differ + c.rowgrad_differ for _, c in cases)
    return detail, f"{differ}/{sum(c.rows for _, c in cases)}"


PROBE = ProbeSpec(
    name="graph_replay", plan_table="graph_replay", plan_type=GraphReplayPlan, run=graph_replay,
    total=lambda plan, ctx: graph_total(plan, ctx.device), role=Role.BEYOND_RFC, record_type=GraphReplay,
    invariant=invariant, failures=failures, problems=problems, words=words,
    label="graph replay", note="a CUDA graph captured once, replayed with other inputs, against eager")
