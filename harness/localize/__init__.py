"""Where a function's rows part: localisation of a failing batch-invariance check down to the module and
the dispatcher op (records.py: what is found; recorder.py: one run recorded as per-row digests; compare.py:
two runs compared; origins.py: the origins; case.py: which case is run again; search.py: one search).

`locate` runs at most two searches for a check's record: the first failing batch check's case (the batch
against the row alone or the sub-batch that differed), and, when parameter gradients did not repeat or
the batch case did not reproduce, all_rows' largest batch against itself (run-to-run)."""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import torch

from h3bench.harness.localize.case import batch_case, repeat_case
from h3bench.harness.localize.records import BATCH, REPEAT, Localisation, Origin, TensorShape
from h3bench.harness.localize.search import search_case
from h3bench.harness.ops.base import Op
from h3bench.harness.schema import BatchInvariance

__all__ = ["BATCH", "REPEAT", "Localisation", "Origin", "TensorShape", "locate"]


def locate(op: Op, params, call: Callable, plans: Mapping, grads: tuple[str, ...], row_grads: tuple[str, ...],
           device: torch.device, bi: BatchInvariance, root: Optional[torch.nn.Module]) -> tuple[Localisation, ...]:
    """The searches a failing record `bi` calls for (none when it is invariant)."""
    if bi.batch_invariant:
        return ()
    found = []
    case = batch_case(bi, plans)
    if case is not None:
        found.append(search_case(op, params, call, grads, row_grads, case, device, root))
    if bi.params_repeatable is False or (found and not found[0].reproduced):
        found.append(search_case(op, params, call, grads, row_grads, repeat_case(plans), device, root))
    return tuple(found)
