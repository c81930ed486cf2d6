"""Two recorded runs compared event by event: which compared rows each op (and module) received equal and
returned different.

Rows map through the runs by `Pairing`: row `batch_rows[j]` of the batch's run is row `other_rows[j]` of
the other run. A tensor is per-row where its first dimension is k times the rows in both runs (the same
k, the same trailing shape): its row blocks are compared; a tensor of the same shape in both runs is
shared (a weight, a position table): compared whole, for every row at once. Anything else (a shape that
changes otherwise with the batch, a tensor laid out batch-second, a tensor subclass) cannot be mapped: an
op reading one is never an origin and is counted as unmapped. In a batch search a shared output that
differs counts in forward (a statistic over the batch) but not in backward, where the shared outputs are
the parameters' gradients, sums over different rows by construction (the repeat search compares them).

The two op streams are aligned by their ops' names and modules; where one run made ops the other did not
(control flow that depends on the batch), the streams part, and only the aligned stretches are compared.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Optional, Sequence

from h3bench.harness.localize.digest import Seen
from h3bench.harness.localize.records import BACKWARD, REPEAT
from h3bench.harness.localize.recorder import OpEvent, Trace


@dataclass(frozen=True)
class Pairing:
    """Which rows of the batch's run (`batch`, `batch_rows`) are which rows of the other run (`other`,
    `other_rows`); `search`: batch or repeat."""

    search: str
    batch: int
    other: int
    batch_rows: tuple[int, ...]
    other_rows: tuple[int, ...]


@dataclass(frozen=True)
class Verdict:
    """Per compared row: whether the inputs were equal (None: some input cannot be mapped) and whether the
    outputs were (None: no output can be compared)."""

    inputs_equal: Optional[tuple[bool, ...]]
    outputs_equal: Optional[tuple[bool, ...]]

    def origin_rows(self) -> list[int]:
        if self.inputs_equal is None or self.outputs_equal is None:
            return []
        return [j for j, (i, o) in enumerate(zip(self.inputs_equal, self.outputs_equal)) if i and not o]

    def inherited(self) -> bool:
        if self.inputs_equal is None or self.outputs_equal is None:
            return False
        return any(not i and not o for i, o in zip(self.inputs_equal, self.outputs_equal))

    @property
    def unmapped(self) -> bool:
        return self.inputs_equal is None


def tensor_equal(a: Seen, b: Seen, pairing: Pairing) -> tuple[Optional[tuple[bool, ...]], bool]:
    """Per compared row, whether `a` (batch's run) and `b` (other run) are bitwise equal there, and
    whether the tensor is shared; (None, False) when it cannot be mapped."""
    m = len(pairing.batch_rows)
    if a.dtype != b.dtype or a.dtype == "undigested":
        return None, False
    if a.shape and b.shape and a.shape[1:] == b.shape[1:] and a.rows is not None and b.rows is not None:
        k_a, k_b = a.shape[0] // pairing.batch, b.shape[0] // pairing.other
        if k_a == k_b and a.shape[0] == k_a * pairing.batch and b.shape[0] == k_b * pairing.other:
            return tuple(a.rows[r] == b.rows[s] for r, s in zip(pairing.batch_rows, pairing.other_rows)), False
    if a.shape == b.shape:
        return (a.whole == b.whole,) * m, True
    return None, False


def _all_rows(flags: Sequence[tuple[bool, ...]], m: int) -> tuple[bool, ...]:
    return tuple(all(f[j] for f in flags) for j in range(m))


def verdict(a_in: Sequence[Seen], a_out: Sequence[Seen], b_in: Sequence[Seen], b_out: Sequence[Seen],
            pairing: Pairing, phase: str, compare_outputs: bool = True) -> Verdict:
    m = len(pairing.batch_rows)
    if len(a_in) != len(b_in) or len(a_out) != len(b_out):
        return Verdict(None, None)
    ins = []
    for a, b in zip(a_in, b_in):
        equal, _ = tensor_equal(a, b, pairing)
        if equal is None:
            return Verdict(None, None)
        ins.append(equal)
    outs = []
    if compare_outputs:
        for a, b in zip(a_out, b_out):
            equal, shared = tensor_equal(a, b, pairing)
            if equal is None or (shared and phase == BACKWARD and pairing.search != REPEAT):
                continue
            outs.append(equal)
    return Verdict(_all_rows(ins, m), _all_rows(outs, m) if outs else None)


def key(trace: Trace, event: OpEvent, phase: str) -> tuple:
    return (event.op, trace.path(event.call)) if phase != BACKWARD else (event.op, event.node, trace.path(event.call))


@dataclass(frozen=True)
class Alignment:
    """The batch's event index -> the other run's, for the aligned stretches; `parted`: where the streams
    first part (None when they align throughout)."""

    pairs: tuple[tuple[int, int], ...]
    parted: Optional[str]


def align(a: Trace, b: Trace, phase: str) -> Alignment:
    ka = [key(a, e, phase) for e in a.ops[phase]]
    kb = [key(b, e, phase) for e in b.ops[phase]]
    if ka == kb:
        return Alignment(tuple((i, i) for i in range(len(ka))), None)
    matcher = difflib.SequenceMatcher(a=ka, b=kb, autojunk=False)
    pairs = tuple((blk.a + k, blk.b + k) for blk in matcher.get_matching_blocks() for k in range(blk.size))
    first = next(op for op in matcher.get_opcodes() if op[0] != "equal")
    _, i, i_end, j, j_end = first
    def shown(keys, lo, hi):
        return ", ".join(f"{k[0]} in {k[-1] or '(the checked object)'}" for k in keys[lo:min(hi, lo + 2)]) or "nothing"
    parted = (f"{phase} op streams part at op {i} of the batch's run ({len(ka)} ops) and op {j} of the other "
              f"({len(kb)} ops): the batch ran {shown(ka, i, i_end)}, the other {shown(kb, j, j_end)}")
    return Alignment(pairs, parted)
