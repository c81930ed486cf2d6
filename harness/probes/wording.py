"""How a probe's counts read: the gate's failure lines (harness/gate.py), the reports' detail cells
(reports/verdicts.py) and validate's problems (harness/semantics.py), for the RFC's probes and each probe
beyond them alike, so that every probe words its counts the same way."""
from __future__ import annotations

from typing import Optional

from h3bench.harness.probes.difference_text import describe
from h3bench.harness.schema import Difference


def first_at(difference: Optional[Difference], located: bool) -> str:
    """A failure line's tail: where and how far the first difference is, when asked for and known."""
    return f" (first: {describe(difference)})" if located and difference is not None else ""


def failure_line(label: str, fwd: int, rowgrad: int, rows: int, difference: Optional[Difference],
                 located: bool) -> str:
    """The gate's line for a check that counted rows whose forward or row gradients differ."""
    return f"{label}: fwd {fwd}, rowgrad {rowgrad} of {rows} rows{first_at(difference, located)}"


def first_where(difference: Optional[Difference]) -> str:
    """A detail cell's tail: where and how far the first difference is; empty without a record."""
    return f"; first: {describe(difference)}" if difference is not None else ""


def differ_count(differ: int, total: int, unit: str) -> str:
    return f"{differ}/{total} {unit} differ"


def case_detail(name: str, tensors: list[str], differ: int, rows: int, rejected: Optional[str],
                difference: Optional[Difference]) -> str:
    """A detail cell's part for one case of a probe: the implementation's refusal where it ran no row, else
    how many of its rows differ in `tensors` and where first."""
    if rejected and not rows:
        return rejected
    return f"{name} ({', '.join(tensors)}): {differ_count(differ, rows, 'rows')}{first_where(difference)}"


def within(path: str, fwd: int, rowgrad: int, rows: int) -> list[str]:
    """Validate's problem when a check's differing counts are not within its rows."""
    if 0 <= fwd <= rows and 0 <= rowgrad <= rows:
        return []
    return [f"{path}: differing rows ({fwd}, {rowgrad}) not within 0..{rows}"]
