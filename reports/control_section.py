"""The negative control's section of a report, shown with `h3bench report --show-control`.

The control is not a row (harness/control.py): the tables of rows, the comparison, the gate and the index
never show it. Its section says whether the plan flagged the planted fault, check by check.
"""
from __future__ import annotations

from h3bench.harness import control
from h3bench.harness.schema import ControlResult, ControlSkipped, Evidence
from h3bench.reports.table_spec import Cell, TableSpec

TITLE = "Negative control"


def control_summary(evidence: Evidence) -> str:
    """One sentence: flagged, blind or skipped; empty when the file has no control record."""
    record = evidence.control
    if record is None:
        return ""
    if isinstance(record, ControlSkipped):
        return f"Not run: {record.skipped}."
    if record.flagged:
        return ("The plan flagged the planted fault in every check: its verdicts can show a batch-variant row "
                "on this machine.")
    return ("The plan is blind on this machine: a check did not see the planted fault, so a batch-invariant "
            "verdict in this file does not show that a row is batch-invariant.")


def control_tables(evidence: Evidence) -> list[TableSpec]:
    """The counts of each check the control must be flagged by; none for a skipped or absent control."""
    record = evidence.control
    if not isinstance(record, ControlResult):
        return []
    rows = [[Cell(name), Cell(f"{differ}/{total}", "num"), Cell("yes" if differ else "no", "yes" if differ else "no")]
            for name, differ, total in control.checks(record)]
    return [TableSpec("Checks of the planted fault", ["check", "differ", "flagged"], rows,
                      note=f"{record.source}. Each check must count a difference: outputs (and row gradients "
                           "rounded in their backward) lose one to three low bits, by the batch size.")]
