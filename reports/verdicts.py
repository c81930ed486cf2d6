"""The batch-invariance checks of one row, each as pass / fail / n.a., with the counts behind it.

Shared by the table, the verdict grid and the comparison so the three never disagree on what failed.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from h3bench.harness.probes.difference_text import describe, describe_param
from h3bench.harness.schema import (Contention, Difference, GradSet, GraphCapture, GraphReplay, Layouts,
                                    ParamDifference, RowResult)


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    NA = "n.a."


# Column order of the verdict grid; `batch_invariant` is the recorded overall verdict (the RFC's checks').
RFC_CHECKS: tuple[str, ...] = ("all_rows fwd", "all_rows rowgrad", "params repeatable", "full_vs_sub", "sweep")
# h3bench's probes beyond the RFC's, each with its own flag; n.a. in a file that lacks them (the prior art)
BEYOND_RFC_CHECKS: tuple[str, ...] = ("contention", "graph replay", "layout", "grad set")
CHECKS: tuple[str, ...] = RFC_CHECKS + BEYOND_RFC_CHECKS
GRID_CHECKS: tuple[str, ...] = CHECKS + ("batch_invariant",)

# How a failed check is named in the "failed" column.
FAILED_LABEL = {
    "all_rows fwd": "all_rows fwd",
    "all_rows rowgrad": "all_rows rowgrad",
    "params repeatable": "params not repeatable",
    "full_vs_sub": "full_vs_sub",
    "sweep": "sweep",
    "contention": "contention",
    "graph replay": "graph replay",
    "layout": "layout",
    "grad set": "grad set",
}


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    short: str = ""  # "differ/total" for the counting checks, for cells too small for `detail`


def _count(differ: int, total: int, unit: str) -> str:
    return f"{differ}/{total} {unit} differ"


def where(d: Optional[Difference]) -> str:
    """Where and how far a difference is, for a detail cell; empty without a record."""
    return f"; first: {describe(d)}" if d is not None else ""


def _first_all_rows(cases) -> Optional[Difference]:
    return next((c.first_difference for c in cases if c.first_difference is not None), None)


def params_detail(differences: Optional[list[ParamDifference]]) -> str:
    if not differences:
        return "parameter gradients differ run to run"
    return "parameter gradients differ run to run: " + ", ".join(describe_param(p) for p in differences)


def checks(row: RowResult) -> list[Check]:
    """The checks in `CHECKS` order."""
    bi = row.batch_invariance
    cases = bi.all_rows.values()
    rows = sum(c.rows for c in cases)
    fwd = sum(c.fwd_differ for c in cases)
    rowgrad = sum(c.rowgrad_differ for c in cases)
    first = where(_first_all_rows(cases))
    out = [Check("all_rows fwd", Status.FAIL if fwd else Status.PASS, _count(fwd, rows, "rows") + (first if fwd else ""),
                 f"{fwd}/{rows}")]
    # A forward-only row records rowgrad counts of 0 without measuring anything: that is not a pass.
    if not row.has_backward and rowgrad == 0:
        out.append(Check("all_rows rowgrad", Status.NA, "no backward"))
    else:
        out.append(Check("all_rows rowgrad", Status.FAIL if rowgrad else Status.PASS,
                         _count(rowgrad, rows, "rows") + (first if rowgrad and not fwd else ""), f"{rowgrad}/{rows}"))
    if bi.params_repeatable is None:
        out.append(Check("params repeatable", Status.NA, "no parameter gradients measured"))
    else:
        out.append(Check("params repeatable", Status.PASS if bi.params_repeatable else Status.FAIL,
                         "bitwise equal run to run" if bi.params_repeatable
                         else params_detail(bi.params_differences)))
    fvs = bi.full_vs_sub_batches
    out.append(Check("full_vs_sub", Status.FAIL if (fvs.fwd_differ or fvs.rowgrad_differ) else Status.PASS,
                     f"fwd {fvs.fwd_differ}, rowgrad {fvs.rowgrad_differ} of {fvs.sub_batches} sub-batches"
                     f"{where(fvs.first_difference)}",
                     f"{fvs.fwd_differ}+{fvs.rowgrad_differ}/{fvs.sub_batches}"))
    sweep = bi.batch_size_sweep
    detail = _count(sweep.differ, sweep.comparisons, "comparisons")
    if sweep.first_failures:
        f = sweep.first_failures[0]
        detail += (where(f.difference) if f.difference is not None
                   else f", first at seed {f.seed}, batch {f.batch}, position {f.position}, row {f.row}")
    out.append(Check("sweep", Status.FAIL if sweep.differ else Status.PASS, detail,
                     f"{sweep.differ}/{sweep.comparisons}"))
    return out + [_contention(bi.contention), _graph_replay(bi.graph_replay), _layout(bi.layout),
                  _grad_set(bi.grad_set)]


def _flag(flag: Optional[bool]) -> Status:
    return Status.NA if flag is None else Status.PASS if flag else Status.FAIL


def _contention(record: Optional[Contention]) -> Check:
    if record is None:
        return Check("contention", Status.NA, "not measured")
    parts, differ, total = [], 0, 0
    for label, case in [("idle", record.idle), *record.loads.items()]:
        text = f"{label}: {_count(case.fwd_differ + case.rowgrad_differ, case.comparisons, 'rows')}"
        if case.params_repeatable is False:
            text += ", parameter gradients " + ("not repeatable" if label == "idle" else "differ from idle")
        if case.runs is not None:
            text += f" ({case.iterations} load iterations, load busy in {case.overlapped}/{case.runs} runs)"
        parts.append(text + where(case.first_difference))
        differ, total = differ + case.fwd_differ + case.rowgrad_differ, total + case.comparisons
    return Check("contention", _flag(record.invariant), "; ".join(parts), f"{differ}/{total}")


def _graph_case(label: str, case: Optional[GraphCapture]) -> str:
    if case is None:
        return ""
    if not case.captured:
        return f"{label}: {case.reason}"
    return (f"{label}: {_count(case.fwd_differ + case.rowgrad_differ, case.rows, 'rows')} in {case.replays} "
            f"replays{where(case.first_difference)}")


def _graph_replay(record: Optional[GraphReplay]) -> Check:
    if record is None:
        return Check("graph replay", Status.NA, "not measured")
    if record.not_run:
        return Check("graph replay", Status.NA, f"not run: {record.not_run}")
    cases = [c for c in (record.forward, record.forward_backward) if c is not None]
    detail = "; ".join(filter(None, (_graph_case("forward", record.forward),
                                     _graph_case("forward+backward", record.forward_backward))))
    differ = sum(c.fwd_differ + c.rowgrad_differ for c in cases)
    return Check("graph replay", _flag(record.invariant), detail, f"{differ}/{sum(c.rows for c in cases)}")


def _layout(record: Optional[Layouts]) -> Check:
    if record is None:
        return Check("layout", Status.NA, "not measured")
    parts = [case.rejected if case.rejected and not case.rows else
             f"{name} ({', '.join(case.tensors)}): {_count(case.fwd_differ + case.rowgrad_differ, case.rows, 'rows')}"
             f"{where(case.first_difference)}" for name, case in record.cases.items()]
    differ = sum(c.fwd_differ + c.rowgrad_differ for c in record.cases.values())
    return Check("layout", _flag(record.invariant), "; ".join(parts) or "no per-row input takes a strided layout",
                 f"{differ}/{sum(c.rows for c in record.cases.values())}")


def _grad_set(record: Optional[GradSet]) -> Check:
    if record is None:
        return Check("grad set", Status.NA, "not measured")
    if record.not_applicable:
        return Check("grad set", Status.NA, f"not applicable: {record.not_applicable}")
    parts = [case.rejected if case.rejected and not case.rows else
             f"{name} ({', '.join(case.tensors)}): {_count(case.rowgrad_differ, case.rows, 'rows')}"
             f"{where(case.first_difference)}" for name, case in record.cases.items()]
    differ = sum(c.rowgrad_differ for c in record.cases.values())
    return Check("grad set", _flag(record.invariant), "; ".join(parts),
                 f"{differ}/{sum(c.rows for c in record.cases.values())}")


def grid(row: RowResult) -> dict[str, Status]:
    """Every column of the verdict grid, the recorded overall verdict last."""
    cells = {c.name: c.status for c in checks(row)}
    cells["batch_invariant"] = Status.PASS if row.batch_invariance.batch_invariant else Status.FAIL
    return cells


def failed(row: RowResult) -> list[Check]:
    return [c for c in checks(row) if c.status is Status.FAIL]


def failure_summary(row: RowResult) -> str:
    """Which checks failed, with counts; empty when the row is batch-invariant and nothing failed."""
    parts = []
    for c in failed(row):
        label = FAILED_LABEL[c.name]
        parts.append(c.detail if c.name == "params repeatable" and "elements" in c.detail
                     else label if c.name == "params repeatable" else f"{label}: {c.detail}")
    if not row.batch_invariance.batch_invariant and not parts:
        # The recorded verdict is the contract; say so rather than invent a reason.
        parts.append("recorded not invariant, no failing count")
    if row.batch_invariance.batch_invariant and any(c.name in RFC_CHECKS for c in failed(row)):
        parts.append("but recorded invariant")
    return "; ".join(parts)
