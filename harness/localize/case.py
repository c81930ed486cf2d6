"""Which case a failing check is localised on: the batch it ran and the rows it compared, rebuilt from the
check's record (its first difference: seed, batch, row and position) and the plan it ran under."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch

from h3bench.harness.localize.compare import Pairing
from h3bench.harness.localize.records import BATCH, REPEAT
from h3bench.harness.schema import BatchInvariance, Difference


@dataclass(frozen=True)
class Case:
    """Draw `inputs` rows with `seed`; the batch's run takes rows `batch_order` of them, the other run
    `other_order`; `pairing` says which rows of the two runs are the same rows."""

    check: str
    seed: int
    inputs: int
    batch_order: tuple[int, ...]
    other_order: tuple[int, ...]
    pairing: Pairing


def _pairing(search: str, batch_order, other_order, batch_rows, other_rows) -> Pairing:
    return Pairing(search, len(batch_order), len(other_order), tuple(batch_rows), tuple(other_rows))


def row_alone(check: str, d: Difference, inputs: int, order: list[int]) -> Case:
    """The batch `order` (rows among `inputs` drawn with the difference's seed) against its row alone."""
    return Case(check, d.seed, inputs, tuple(order), (d.row,),
                _pairing(BATCH, order, [d.row], [d.position], [0]))


def sweep_order(plan, seed: int, batch: int, position: int, row: int) -> list[int]:
    """The sweep's batch that put `row` at `position` in a batch of `batch` rows (harness/probes/
    batch_invariance.py batch_size_sweep draws it so: one permutation per size and probe row, in order)."""
    n = plan.rows
    if batch == n and position == n - 1 - row:
        return list(range(n - 1, -1, -1))
    gen = torch.Generator().manual_seed(seed)
    for m in plan.batch_sizes():
        for r in plan.probe_rows():
            perm = torch.randperm(n, generator=gen)
            others = perm[perm != r][:m - 1].tolist()
            if m == batch and r == row and position in plan.positions(m):
                return others[:position] + [r] + others[position:]
    raise ValueError(f"the sweep has no batch of {batch} rows with row {row} at position {position}")


def batch_case(bi: BatchInvariance, plans: Mapping) -> Optional[Case]:
    """The first failing batch check's case: a row alone (all_rows, the sweep) or a sub-batch (the
    sub-batches) against the batch it rode in; None when no check recorded where it differed."""
    for size, case in sorted(bi.all_rows.items(), key=lambda kv: int(kv[0])):
        d = case.first_difference
        if d is not None:
            return row_alone(f"all_rows {size}", d, d.batch, list(range(d.batch)))
    subs, d = bi.full_vs_sub_batches, bi.full_vs_sub_batches.first_difference
    if d is not None:
        start = d.row - d.position
        rows = list(range(start, start + d.batch))
        return Case("full_vs_sub_batches", d.seed, subs.full_batch, tuple(range(subs.full_batch)), tuple(rows),
                    _pairing(BATCH, range(subs.full_batch), rows, rows, range(len(rows))))
    for failure in bi.batch_size_sweep.first_failures:
        d = failure.difference
        if d is not None:
            order = sweep_order(plans["sweep"], d.seed, d.batch, d.position, d.row)
            return row_alone("batch_size_sweep", d, plans["sweep"].rows, order)
    return None


def repeat_case(plans: Mapping) -> Case:
    """all_rows' largest batch run twice: where parameter gradients (or anything) fail to repeat."""
    plan = plans["all_rows"]
    n, seed = max(plan.batch_sizes), plan.seeds[0]
    order = tuple(range(n))
    return Case("param_grads", seed, n, order, order, _pairing(REPEAT, order, order, order, order))
