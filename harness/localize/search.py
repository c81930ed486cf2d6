"""One origin search: the failing check's case run again under the recorder, the two runs compared, the
origins' outputs captured, and the record.

Runs, in order: the other side (a row alone, a sub-batch, or the batch itself for a repeat search),
recorded as digests; the batch, recorded as digests and compared event by event against the first as it
goes, keeping the compared rows of each op output that parts (at most MAX_CAPTURED events); then the
other side once more, keeping the same events' outputs, for the distances. The search's extra run is
that third one, the smaller side of the case for a batch search.

Memory: the digests are one int64 per row per tensor each op reads or returns, plus one for the whole
tensor ((rows + 1) * 8 bytes a tensor: for a 2-layer LM's ~1,300 op events of ~3 tensors at 33 rows,
about 1 MB); the tensors kept are the origin ops' outputs at the compared rows only, for at most
MAX_CAPTURED events (a parameter gradient whole in a repeat search). No activation is kept otherwise.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from h3bench.harness.execute import as_outputs, backward, bitwise_equal, make_leaves
from h3bench.harness.localize.case import Case
from h3bench.harness.localize.compare import Pairing, verdict
from h3bench.harness.localize.origins import compare, distance, grouped
from h3bench.harness.localize.records import Localisation
from h3bench.harness.localize.recorder import OpEvent, Recorder, Trace
from h3bench.harness.ops.base import Op

MAX_CAPTURED = 64


class _Side:
    """One side of the case: its inputs and upstream gradients, and how to run it."""

    def __init__(self, op: Op, params, call: Callable, grads: tuple[str, ...], case: Case, order, device):
        drawn = op.make_inputs(params, case.inputs, case.seed, device)
        grad_outs = op.make_grad_outs(params, case.inputs, case.seed, device)
        index = torch.as_tensor(list(order), dtype=torch.long, device=device)
        self.inputs = drawn.select_rows(index)
        self.grad_outs = tuple(g.index_select(0, index) for g in grad_outs)
        self.rows = len(order)
        self.call, self.grads, self.n_outputs = call, grads, len(op.outputs)

    def run(self, recorder: Optional[Recorder] = None):
        """Outputs and gradients (every one asked for) of one run, recorded when `recorder` is given."""
        leaves = make_leaves(self.inputs, self.grads)
        names = list(self.inputs.tensors)
        with torch.set_grad_enabled(bool(self.grads)):
            if recorder is None:
                outputs = as_outputs(self.call(*leaves), self.n_outputs)
                if self.grads:
                    backward(outputs, self.grad_outs)
            else:
                with recorder.active():
                    outputs = as_outputs(self.call(*leaves), self.n_outputs)
                    if self.grads:
                        backward(outputs, self.grad_outs)
        grads = {n: leaf.grad for n, leaf in zip(names, leaves) if n in self.grads and leaf.grad is not None}
        return tuple(o.detach() for o in outputs), grads


WINDOW = 256  # how far ahead in the first run a parted stream is looked for while the batch runs


def _online(first: Trace, pairing: Pairing, budget: list[int],
            own: list[Trace]) -> Callable[[str, int, OpEvent], Optional[list[int]]]:
    """Capture in the batch's run: an event parts against the first run's event it follows (the next one
    with the same op, node and module, within WINDOW events where the streams part)."""
    at = {phase: 0 for phase in first.ops}

    def capture(phase: str, index: int, event: OpEvent) -> Optional[list[int]]:
        others, start = first.ops[phase], at[phase]
        here = (event.op, event.node, own[0].path(event.call))
        match = next((j for j in range(start, min(start + WINDOW, len(others)))
                      if (others[j].op, others[j].node, first.path(others[j].call)) == here), None)
        if match is None:
            return None
        at[phase] = match + 1
        other = others[match]
        v = verdict(event.inputs, event.outputs, other.inputs, other.outputs, pairing, phase, event.compare_outputs)
        if budget[0] <= 0 or not v.origin_rows():
            return None
        budget[0] -= 1
        return list(pairing.batch_rows)
    return capture


def _reproduced(case: Case, a, b, row_grads: tuple[str, ...]) -> bool:
    """Whether the batch's run and the other differ at the compared rows (a repeat: anywhere)."""
    p = case.pairing
    ia = torch.as_tensor(p.batch_rows, dtype=torch.long)
    ib = torch.as_tensor(p.other_rows, dtype=torch.long)
    (out_a, grads_a), (out_b, grads_b) = a, b
    pairs = list(zip(out_a, out_b)) + [(grads_a[g], grads_b[g]) for g in row_grads if g in grads_a and g in grads_b]
    if p.search == "repeat":
        pairs += [(grads_a[g], grads_b[g]) for g in grads_a if g not in row_grads and g in grads_b]
        return any(not bitwise_equal(x, y) for x, y in pairs)
    return any(not bitwise_equal(x.index_select(0, ia.to(x.device)), y.index_select(0, ib.to(y.device)))
               for x, y in pairs)


def search_case(op: Op, params, call: Callable, grads: tuple[str, ...], row_grads: tuple[str, ...], case: Case,
           device: torch.device, root: Optional[torch.nn.Module]) -> Localisation:
    """The origins of one failing check (`case`), as a Localisation record."""
    started = time.perf_counter()
    batch = _Side(op, params, call, grads, case, case.batch_order, device)
    other = _Side(op, params, call, grads, case, case.other_order, device)
    note = None
    hooks = True
    try:
        b_trace, a_trace, a_result, b_result = _recorded(batch, other, case, root, hooks)
    except Exception as exc:  # a model writing in place into a module's input refuses full backward hooks
        hooks = False
        note = f"module backward hooks refused ({type(exc).__name__}): backward modules named by their ops only"
        b_trace, a_trace, a_result, b_result = _recorded(batch, other, case, root, hooks)
    found = compare(a_trace, b_trace, case.pairing)
    wanted = {}
    for f in found.found:
        if f.op is None:
            continue
        pair = dict(found.alignments[f.phase].pairs).get(f.index)
        if pair is not None and (f.phase, f.index) in a_trace.captured:
            wanted[(f.phase, pair)] = f
    rows = list(case.pairing.other_rows)
    again = Recorder(other.rows, root, capture=lambda phase, i, _e: rows if (phase, i) in wanted else None,
                     module_backward_hooks=hooks)
    other.run(again)
    for (phase, j), f in wanted.items():
        distance(f, a_trace.captured.get((phase, f.index)), again.trace.captured.get((phase, j)))
    for f in found.found:
        if f.op is not None and (f.phase, f.index) not in a_trace.captured:
            f.reason = f.reason or f"outputs not captured (more than {MAX_CAPTURED} parting ops, or streams part)"
    reproduced = _reproduced(case, a_result, b_result, row_grads)
    if not reproduced:
        note = "; ".join(filter(None, [note, "the case run again gave the same bits on both sides: the difference "
                                             "did not reproduce (run-to-run nondeterminism?)"]))
    return Localisation(
        search=case.pairing.search, check=case.check, seed=case.seed, batch=batch.rows,
        compared_rows=list(case.pairing.batch_rows), other_rows=other.rows, reproduced=reproduced,
        origins=grouped(found.found, case.pairing.search), ops=found.ops, inherited_ops=found.inherited,
        unmapped_ops=found.unmapped, streams=found.streams, runs=3,
        seconds=round(time.perf_counter() - started, 3), note=note)


def _recorded(batch: _Side, other: _Side, case: Case, root, hooks: bool):
    first = Recorder(other.rows, root, module_backward_hooks=hooks)
    b_result = other.run(first)
    own: list[Trace] = []
    second = Recorder(batch.rows, root, capture=_online(first.trace, case.pairing, [MAX_CAPTURED], own),
                      module_backward_hooks=hooks)
    own.append(second.trace)
    a_result = batch.run(second)
    return first.trace, second.trace, a_result, b_result

