"""An evidence file as one long CSV table, for people who tabulate elsewhere (a spreadsheet, pandas, R):
one line per figure, columns op, mode, row, check, size, figure, value.

- check "batch_invariance": the verdicts (batch_invariant, params_repeatable: 1 / 0, empty when n/a) and
  every count (all_rows <size> rows / fwd_differ / rowgrad_differ, full_vs_sub_batches sub_batches / ...,
  batch_size_sweep comparisons / differ);
- check "accuracy_latency": every number of each size's record (errors, latencies in us, floors, their
  fractions; grad_rel_err as grad_rel_err.<input>, the spreads as spread.<figure>.<p10|p50|p90|n>);
- check "unavailable": a row or mode that did not run, its reason as the value.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Iterator, Union

from h3bench.harness import schema
from h3bench.harness.semantics import numbers
from h3bench.harness.schema import Evidence, RowResult, UnavailableMode, UnavailableRow

COLUMNS = ("op", "mode", "row", "check", "size", "figure", "value")


def rows(evidence: Evidence) -> Iterator[tuple]:
    op = evidence.op
    for mode, found in evidence.results.items():
        if isinstance(found, UnavailableMode):
            yield (op, mode, "", "unavailable", "", "reason", found.unavailable)
            continue
        for name, row in found.items():
            if isinstance(row, UnavailableRow):
                yield (op, mode, name, "unavailable", "", "reason", row.unavailable)
                continue
            assert isinstance(row, RowResult)
            bi = row.batch_invariance
            yield (op, mode, name, "batch_invariance", "", "batch_invariant", int(bi.batch_invariant))
            yield (op, mode, name, "batch_invariance", "", "params_repeatable",
                   "" if bi.params_repeatable is None else int(bi.params_repeatable))
            for size, case in bi.all_rows.items():
                for figure in ("rows", "fwd_differ", "rowgrad_differ"):
                    yield (op, mode, name, "batch_invariance", size, f"all_rows.{figure}", getattr(case, figure))
            subs = bi.full_vs_sub_batches
            for figure in ("full_batch", "sub_batches", "fwd_differ", "rowgrad_differ"):
                yield (op, mode, name, "batch_invariance", "", f"full_vs_sub_batches.{figure}", getattr(subs, figure))
            for figure in ("comparisons", "differ"):
                yield (op, mode, name, "batch_invariance", "", f"batch_size_sweep.{figure}",
                       getattr(bi.batch_size_sweep, figure))
            for size, result in sorted(row.accuracy_latency.items(), key=lambda kv: schema.size_key(kv[0])):
                for figure, value in numbers(result):
                    yield (op, mode, name, "accuracy_latency", size, figure, value)


def to_csv(evidence: Evidence) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(rows(evidence))
    return buffer.getvalue()


def write_csv(evidence_path: Union[str, Path], out_dir: Union[str, Path, None] = None) -> Path:
    """`<name>.csv` beside the evidence file (or in out_dir)."""
    evidence_path = Path(evidence_path)
    out = Path(out_dir) if out_dir is not None else evidence_path.parent
    out.mkdir(parents=True, exist_ok=True)
    path = schema.write_atomic(out / f"{evidence_path.stem}.csv", to_csv(schema.load(evidence_path)))
    path.chmod(0o644)
    return path
