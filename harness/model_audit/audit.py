"""One mode's verdict on a model: the assertion (harness/testing) with localisation, its counts, failures,
origins and searches, and the op audit of each origin op."""
from __future__ import annotations

from h3bench.harness.model_audit.factory import Checkable
from h3bench.harness.model_audit.op_audit import audit
from h3bench.harness.model_schema import CheckCount, ModeResult


def check(model: Checkable, plan: str, grads: bool = True) -> ModeResult:
    from h3bench.testing import check_batch_invariance

    record = check_batch_invariance(model.fn, model.examples, model.per_row, plan=plan, grads=grads,
                                    name=model.model_type, out_dtype=model.out_dtypes, locate=True)
    audits = []
    for origin in record.origins:
        found = audit(origin)
        if found is not None and found.command not in {a.command for a in audits}:
            audits.append(found)
    return ModeResult(invariant=record.invariant,
                      counts={k: CheckCount(c.compared, c.unit, c.differ) for k, c in record.counts.items()},
                      failures=list(record.failures), origins=list(record.origins),
                      localisations=list(record.localisations), audits=audits, seconds=round(record.seconds, 3),
                      unavailable=record.unavailable)
