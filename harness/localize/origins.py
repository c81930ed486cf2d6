"""Where the rows part, from two recorded runs (harness/localize/compare.py's verdicts): the ops that
received equal rows and returned different ones, each in the innermost module call it ran in, and the
innermost modules with that property in which no op could be named; grouped when the same op parts in
the same kind of module again, earliest first (forward, then backward)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch

from h3bench.harness.localize.compare import Alignment, Pairing, Verdict, align, verdict
from h3bench.harness.localize.digest import Seen
from h3bench.harness.localize.records import BACKWARD, FORWARD, PHASES, Origin, TensorShape
from h3bench.harness.localize.recorder import Trace
from h3bench.harness.probes.difference import first_difference

OUTSIDE = "(outside any module)"


@dataclass
class Found:
    """One parting place before grouping: phase, event index in the batch's run (None for a module), the
    rows, where it ran, what it saw, and the distance once captured."""

    phase: str
    index: int
    rows: list[int]
    module: str
    module_type: str
    op: Optional[str]
    inputs: tuple[Seen, ...]
    outputs: tuple[Seen, ...]
    backward_op: Optional[str] = None
    node: Optional[str] = None
    reason: Optional[str] = None
    max_ulp: Optional[int] = None
    max_abs: Optional[float] = None


@dataclass
class Comparison:
    """Everything the two runs' comparison gives, per phase."""

    found: list[Found] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    inherited: dict[str, int] = field(default_factory=dict)
    unmapped: dict[str, int] = field(default_factory=dict)
    streams: dict[str, str] = field(default_factory=dict)
    alignments: dict[str, Alignment] = field(default_factory=dict)


def _within(path: Optional[str], module: str) -> bool:
    if path is None:
        return False
    return module == "" or path == module or path.startswith(module + ".")


def _module_of(a: Trace, call: Optional[int]) -> tuple[str, str]:
    if call is None:
        return OUTSIDE, ""
    return a.calls[call].path, a.calls[call].type


def compare(a: Trace, b: Trace, pairing: Pairing) -> Comparison:
    """The batch's run `a` against the other run `b`."""
    result = Comparison()
    rows_of = pairing.batch_rows
    for phase in PHASES:
        alignment = align(a, b, phase)
        result.alignments[phase] = alignment
        result.streams[phase] = alignment.parted or "aligned"
        result.ops[phase] = len(a.ops[phase])
        inherited = unmapped = 0
        op_rows: list[tuple[Optional[str], set[int]]] = []  # per origin op: its module path and rows
        unmapped_ops: list[tuple[Optional[str], str, tuple[Seen, ...]]] = []
        for i, j in alignment.pairs:
            ea, eb = a.ops[phase][i], b.ops[phase][j]
            v = verdict(ea.inputs, ea.outputs, eb.inputs, eb.outputs, pairing, phase, ea.compare_outputs)
            if v.unmapped:
                unmapped += 1
                unmapped_ops.append((a.path(ea.call), ea.op, ea.inputs))
                continue
            inherited += v.inherited()
            rows = v.origin_rows()
            if not rows:
                continue
            module, kind = _module_of(a, ea.call)
            op = ea.forward_op or ea.op if phase == BACKWARD else ea.op
            result.found.append(Found(phase, i, [rows_of[r] for r in rows], module, kind, op, ea.inputs, ea.outputs,
                                      backward_op=ea.op if phase == BACKWARD else None, node=ea.node))
            op_rows.append((a.path(ea.call), {rows_of[r] for r in rows}))
        result.inherited[phase], result.unmapped[phase] = inherited, unmapped
        result.found += _module_only(a, b, pairing, phase, op_rows, unmapped_ops, alignment)
    result.found.sort(key=lambda f: (PHASES.index(f.phase), f.index))
    return result


def _module_events(trace: Trace, phase: str) -> list:
    return trace.calls if phase == FORWARD else trace.backward_modules


def _occurrences(events: list) -> dict[tuple[str, int], int]:
    seen: Counter = Counter()
    found = {}
    for i, e in enumerate(events):
        found[(e.path, seen[e.path])] = i
        seen[e.path] += 1
    return found


def _module_only(a: Trace, b: Trace, pairing: Pairing, phase: str, op_rows, unmapped_ops,
                 alignment: Alignment) -> list[Found]:
    """The innermost module events whose rows part where no op in them was named for those rows."""
    ea_all, eb_all = _module_events(a, phase), _module_events(b, phase)
    b_at = _occurrences(eb_all)
    candidates: list[tuple[int, str, set[int]]] = []
    for (path, k), i in _occurrences(ea_all).items():
        j = b_at.get((path, k))
        if j is None:
            continue
        ma, mb = ea_all[i], eb_all[j]
        v: Verdict = verdict(ma.inputs, ma.outputs, mb.inputs, mb.outputs, pairing, phase)
        rows = {pairing.batch_rows[r] for r in v.origin_rows()}
        if rows:
            candidates.append((i, path, rows))
    found = []
    for i, path, rows in candidates:
        inner = [p for _, p, r in candidates if p != path and _within(p, path) and r & rows]
        named = set().union(*[r for p, r in op_rows if _within(p, path)] or [set()])
        left = sorted(rows - named)
        if inner or not left:
            continue
        module = ea_all[i]
        found.append(Found(phase, -1, left, path, module.type, None, module.inputs, module.outputs,
                           reason=_why_unnamed(path, unmapped_ops, alignment)))
    return found


def _why_unnamed(path: str, unmapped_ops, alignment: Alignment) -> str:
    inside = [(op, inputs) for p, op, inputs in unmapped_ops if _within(p, path)]
    if inside:
        op, inputs = inside[0]
        shapes = ", ".join(f"[{' x '.join(map(str, s.shape))}]" for s in inputs[:3])
        return f"its op {op} reads tensors that cannot be mapped to rows ({shapes}): not row-major in the batch"
    if alignment.parted:
        return alignment.parted
    return ("no dispatcher op in it received equal rows and returned different ones: the difference arises "
            "outside the dispatcher (Python, or a library that bypasses it)")


def distance(found: Found, a_captured: Optional[list[torch.Tensor]], b_captured: Optional[list[torch.Tensor]]) -> None:
    """The largest distance over the op's outputs at the captured rows (ULPs of each output's dtype)."""
    if a_captured is None or b_captured is None:
        found.reason = found.reason or "outputs not captured"
        return
    worst_ulp, worst_abs = None, None
    for k, (x, y) in enumerate(zip(a_captured, b_captured)):
        if x.shape != y.shape or x.dtype != y.dtype:
            continue
        width = x.shape[0] if x.dim() else 1
        d = first_difference([(f"output {k}", x, y)], seed=0, batch=width, positions=range(width), rows=range(width))
        if d is None:
            continue
        if worst_ulp is None or d.max_ulp < 0 or (worst_ulp >= 0 and d.max_ulp > worst_ulp):
            worst_ulp = d.max_ulp
        worst_abs = d.max_abs if worst_abs is None else max(worst_abs, d.max_abs)
    found.max_ulp, found.max_abs = worst_ulp, worst_abs


def _shapes(seen: tuple[Seen, ...]) -> list[TensorShape]:
    return [TensorShape(list(s.shape), s.dtype) for s in seen]


def grouped(found: list[Found], search: str) -> list[Origin]:
    """One Origin per (phase, op, module class, backward op), in order of first appearance."""
    groups: dict[tuple, list[Found]] = {}
    for f in found:
        groups.setdefault((f.phase, f.op, f.module_type, f.backward_op, f.op is None and f.module), []).append(f)
    origins = []
    for members in groups.values():
        first = members[0]
        ulps = [m.max_ulp for m in members if m.max_ulp is not None]
        abses = [m.max_abs for m in members if m.max_abs is not None]
        origins.append(Origin(
            search=search, phase=first.phase, module=first.module, module_type=first.module_type, op=first.op,
            inputs=_shapes(first.inputs), outputs=_shapes(first.outputs),
            rows=sorted({r for m in members for r in m.rows}),
            instances=list(dict.fromkeys(m.module for m in members)), count=len(members),
            max_ulp=(-1 if any(u < 0 for u in ulps) else max(ulps)) if ulps else None,
            max_abs=max(abses) if abses else None, backward_op=first.backward_op, node=first.node,
            reason=first.reason))
    return origins
