"""Rich progress for long runs and the summary table printed at the end."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.schema import Evidence, RowResult, UnavailableRow


class RichObserver:
    """One progress line per row: adapter, current probe, units done (rows, sub-batches, comparisons)."""

    def __init__(self, console: Console):
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.task: Optional[int] = None
        self.label = ""

    def __enter__(self) -> "RichObserver":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def row_started(self, mode: str, name: str, totals: dict[str, int]) -> None:
        self.label = f"{mode}/{name}"
        self.task = self.progress.add_task(self.label, total=sum(totals.values()))

    def probe_started(self, probe: str) -> None:
        self.progress.update(self.task, description=f"{self.label}: {probe}")

    def advance(self, n: int) -> None:
        self.progress.advance(self.task, n)

    def row_finished(self, mode: str, name: str, row) -> None:
        self.progress.stop_task(self.task)  # an unavailable row's clock must not run on
        if isinstance(row, UnavailableRow):
            where = f" in {row.failed_probe}" if row.failed_probe else ""
            self.progress.update(self.task, description=f"{self.label}: unavailable{where}")
        else:
            verdict = "invariant" if row.batch_invariance.batch_invariant else "NOT invariant"
            self.progress.update(self.task, description=f"{self.label}: {verdict} ({row.wall_s:.1f}s)")


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(evidence: Evidence) -> Table:
    table = Table(title=f"{evidence.op} on {evidence.environment.gpu or evidence.environment.device}"
                        f"{' (quick)' if evidence.quick else ''}")
    for column in ("mode", "row", "batch-invariant", "params repeatable", "size", "fwd err", "max grad err",
                   "fwd us", "fwd+bwd us", "net fwd+bwd us", "fwd floor", "net floor", "wall s"):
        table.add_column(column, justify="left" if column in ("mode", "row") else "right")
    for mode, rows in evidence.results.items():
        for name, row in rows.items():
            if isinstance(row, UnavailableRow):
                table.add_row(mode, name, f"[yellow]unavailable: {row.unavailable}[/]", *[""] * 10)
                continue
            assert isinstance(row, RowResult)
            bi = row.batch_invariance
            size, result = max(row.accuracy_latency.items(), key=lambda kv: int(kv[0]))
            grads = result.grad_rel_err or {}
            table.add_row(
                mode, name, "[green]yes[/]" if bi.batch_invariant else "[red]no[/]",
                {True: "yes", False: "[red]no[/]", None: "n/a"}[bi.params_repeatable], size,
                _fmt(result.fwd_rel_err, ".2e"), _fmt(max(grads.values()) if grads else None, ".2e"),
                _fmt(result.fwd_us, ".1f"), _fmt(result.fwd_bwd_us, ".1f"), _fmt(result.fwd_bwd_net_us, ".1f"),
                _fmt(result.fwd_floor_fraction, ".0%"), _fmt(result.fwd_bwd_net_floor_fraction, ".0%"),
                _fmt(row.wall_s, ".1f"))
    return table
