"""Bitwise comparison of a row's results: the (name, got, expected) pairs and the rows picked from a full
batch, which every batch-invariance probe uses, and for the probes beyond the RFC's (contention, graph
replay, layout) per-row flags for outputs and per-row gradients, counted with one read-back, and the first
difference located only when something differed (harness/probes/difference.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from h3bench.harness.execute import Outcome, any_rows_differ
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.probes.difference import first_difference
from h3bench.harness.schema import Difference


@dataclass
class Compared:
    """`got` against the expected outputs and per-row gradients of the same rows; `batch`, `positions` and
    `rows` say where the compared rows rode in `got`'s run (as difference.first_difference takes them)."""

    got: Outcome
    want_outputs: tuple[torch.Tensor, ...]
    want_grads: dict[str, torch.Tensor]
    batch: int
    positions: Sequence[int]
    rows: Sequence[int]


def pairs(ctx: ProbeContext, got: Outcome, want_outputs, want_grads: dict[str, torch.Tensor]) -> list:
    """(tensor name, got, expected) for every output, then every per-row gradient."""
    return ([(name, g, w) for name, g, w in zip(ctx.op.outputs, got.outputs, want_outputs)]
            + [(f"grad {g}", got.grads[g], want_grads[g]) for g in ctx.row_grads])


def _flags(ctx: ProbeContext, c: Compared) -> tuple[torch.Tensor, torch.Tensor]:
    fwd = any_rows_differ(list(zip(c.got.outputs, c.want_outputs)))
    if not ctx.row_grads:
        return fwd, torch.zeros_like(fwd)
    return fwd, any_rows_differ([(c.got.grads[g], c.want_grads[g]) for g in ctx.row_grads])


@dataclass
class Tally:
    rows: int = 0
    fwd_differ: int = 0
    rowgrad_differ: int = 0
    first_difference: Optional[Difference] = None

    def add(self, ctx: ProbeContext, compared: list[Compared], seed: int) -> None:
        """Count the rows of `compared` whose outputs, or per-row gradients, differ; keep the first one."""
        if not compared:
            return
        flags = [_flags(ctx, c) for c in compared]
        counts = torch.stack([torch.cat([f for f, _ in flags]).sum(), torch.cat([g for _, g in flags]).sum()])
        fwd, rowgrad = (int(v) for v in counts.tolist())
        self.rows += sum(len(c.rows) for c in compared)
        self.fwd_differ, self.rowgrad_differ = self.fwd_differ + fwd, self.rowgrad_differ + rowgrad
        if (fwd or rowgrad) and self.first_difference is None:
            for c in compared:
                found = first_difference(pairs(ctx, c.got, c.want_outputs, c.want_grads), seed=seed,
                                         batch=c.batch, positions=c.positions, rows=c.rows)
                if found is not None:
                    self.first_difference = found
                    break

    @property
    def clean(self) -> bool:
        return self.fwd_differ == 0 and self.rowgrad_differ == 0


def picked(ctx: ProbeContext, full: Outcome, rows: Sequence[int]) -> tuple[tuple[torch.Tensor, ...], dict]:
    """The outputs and per-row gradients of `rows` of `full`."""
    return picked_at(ctx, full, ctx.rows_index(rows))


def picked_at(ctx: ProbeContext, full: Outcome, index: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], dict]:
    """The outputs and per-row gradients of `full` at the row indices `index` (a device tensor)."""
    return (tuple(o.index_select(0, index) for o in full.outputs),
            {g: full.grads[g].index_select(0, index) for g in ctx.row_grads})
