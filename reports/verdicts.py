"""The batch-invariance checks of one row, each as pass / fail / n.a., with the counts behind it.

Shared by the table, the verdict grid and the comparison so the three never disagree on what failed.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from h3bench.harness.probes import registry
from h3bench.harness.probes.difference_text import describe_param
from h3bench.harness.probes.registry import ProbeSpec
from h3bench.harness.probes.wording import differ_count, first_where
from h3bench.harness.schema import Difference, ParamDifference, RowResult


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    NA = "n.a."


# The RFC's checks, in the verdict grid's order; `batch_invariant` is the recorded overall verdict (theirs).
RFC_CHECKS: tuple[str, ...] = ("all_rows fwd", "all_rows rowgrad", "params repeatable", "full_vs_sub", "sweep")
GRID_VERDICT = "batch_invariant"


def beyond_rfc_checks() -> tuple[str, ...]:
    """h3bench's probes beyond the RFC's, each its own check with its own flag (harness/probes/registry.py);
    n.a. in a file that lacks them (the prior art)."""
    return tuple(spec.label for spec in registry.beyond_rfc())


def all_checks() -> tuple[str, ...]:
    """Every check, in `checks`' order."""
    return RFC_CHECKS + beyond_rfc_checks()


def grid_columns() -> tuple[str, ...]:
    """The verdict grid's columns: every check, then the recorded overall verdict."""
    return all_checks() + (GRID_VERDICT,)


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    short: str = ""  # "differ/total" for the counting checks, for cells too small for `detail`


def _first_all_rows(cases) -> Optional[Difference]:
    return next((c.first_difference for c in cases if c.first_difference is not None), None)


def params_detail(differences: Optional[list[ParamDifference]]) -> str:
    if not differences:
        return "parameter gradients differ run to run"
    return "parameter gradients differ run to run: " + ", ".join(describe_param(p) for p in differences)


def checks(row: RowResult) -> list[Check]:
    """The checks in `all_checks()`' order."""
    bi = row.batch_invariance
    cases = bi.all_rows.values()
    rows = sum(c.rows for c in cases)
    fwd = sum(c.fwd_differ for c in cases)
    rowgrad = sum(c.rowgrad_differ for c in cases)
    first = first_where(_first_all_rows(cases))
    out = [Check("all_rows fwd", Status.FAIL if fwd else Status.PASS,
                 differ_count(fwd, rows, "rows") + (first if fwd else ""), f"{fwd}/{rows}")]
    # A forward-only row records rowgrad counts of 0 without measuring anything: that is not a pass.
    if not row.has_backward and rowgrad == 0:
        out.append(Check("all_rows rowgrad", Status.NA, "no backward"))
    else:
        out.append(Check("all_rows rowgrad", Status.FAIL if rowgrad else Status.PASS,
                         differ_count(rowgrad, rows, "rows") + (first if rowgrad and not fwd else ""),
                         f"{rowgrad}/{rows}"))
    if bi.params_repeatable is None:
        out.append(Check("params repeatable", Status.NA, "no parameter gradients measured"))
    else:
        out.append(Check("params repeatable", Status.PASS if bi.params_repeatable else Status.FAIL,
                         "bitwise equal run to run" if bi.params_repeatable
                         else params_detail(bi.params_differences)))
    fvs = bi.full_vs_sub_batches
    out.append(Check("full_vs_sub", Status.FAIL if (fvs.fwd_differ or fvs.rowgrad_differ) else Status.PASS,
                     f"fwd {fvs.fwd_differ}, rowgrad {fvs.rowgrad_differ} of {fvs.sub_batches} sub-batches"
                     f"{first_where(fvs.first_difference)}",
                     f"{fvs.fwd_differ}+{fvs.rowgrad_differ}/{fvs.sub_batches}"))
    sweep = bi.batch_size_sweep
    detail = differ_count(sweep.differ, sweep.comparisons, "comparisons")
    if sweep.first_failures:
        f = sweep.first_failures[0]
        detail += (first_where(f.difference) if f.difference is not None
                   else f", first at seed {f.seed}, batch {f.batch}, position {f.position}, row {f.row}")
    out.append(Check("sweep", Status.FAIL if sweep.differ else Status.PASS, detail,
                     f"{sweep.differ}/{sweep.comparisons}"))
    return out + [_beyond_rfc_check(spec, bi.beyond_rfc.get(spec.name)) for spec in registry.beyond_rfc()]


def _flag(flag: Optional[bool]) -> Status:
    return Status.NA if flag is None else Status.PASS if flag else Status.FAIL


def _beyond_rfc_check(spec: ProbeSpec, record) -> Check:
    """A probe beyond the RFC's: its own flag, in the words its module gives its record."""
    if record is None:
        return Check(spec.label, Status.NA, "not measured")
    detail, short = spec.words(record)
    return Check(spec.label, _flag(record.invariant), detail, short)


def grid(row: RowResult) -> dict[str, Status]:
    """Every column of the verdict grid, the recorded overall verdict last."""
    cells = {c.name: c.status for c in checks(row)}
    cells[GRID_VERDICT] = Status.PASS if row.batch_invariance.batch_invariant else Status.FAIL
    return cells


def failed(row: RowResult) -> list[Check]:
    return [c for c in checks(row) if c.status is Status.FAIL]


def failure_summary(row: RowResult) -> str:
    """Which checks failed, with counts; empty when the row is batch-invariant and nothing failed."""
    parts = []
    for c in failed(row):
        if c.name != "params repeatable":
            parts.append(f"{c.name}: {c.detail}")
        else:  # the moved gradients where the file names them
            parts.append(c.detail if "elements" in c.detail else "params not repeatable")
    if not row.batch_invariance.batch_invariant and not parts:
        # The recorded verdict is the contract; say so rather than invent a reason.
        parts.append("recorded not invariant, no failing count")
    if row.batch_invariance.batch_invariant and any(c.name in RFC_CHECKS for c in failed(row)):
        parts.append("but recorded invariant")
    return "; ".join(parts)
