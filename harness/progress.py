"""Rich progress for long runs and the summary table printed at the end."""
from __future__ import annotations

from typing import Optional

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from h3bench.harness.schema import Evidence, RowResult, UnavailableMode, UnavailableRow, sizes_of


class RichObserver:
    """One progress line per row (adapter, current probe, units done) and one per shared phase (the
    rows' interleaved latency rounds, modes in child processes)."""

    def __init__(self, console: Console):
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.tasks: dict[str, int] = {}
        self.current: Optional[int] = None
        self.label = ""

    def __enter__(self) -> "RichObserver":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def _start(self, label: str, total: int) -> None:
        self.label = label
        self.current = self.tasks[label] = self.progress.add_task(label, total=total)

    def row_started(self, mode: str, name: str, totals: dict[str, int]) -> None:
        self._start(f"{mode}/{name}", sum(totals.values()))

    def probe_started(self, probe: str) -> None:
        self.progress.update(self.current, description=f"{self.label}: {probe}")

    def advance(self, n: int) -> None:
        if self.current is not None:
            self.progress.advance(self.current, n)

    def phase_started(self, mode: str, label: str, total: int) -> None:
        self._start(f"{mode}: {label}", total)

    def phase_finished(self) -> None:
        self.progress.stop_task(self.current)

    def row_finished(self, mode: str, name: str, row) -> None:
        label = f"{mode}/{name}"
        task = self.tasks.get(label)
        if task is None:
            return
        self.progress.stop_task(task)  # an unavailable row's clock must not run on
        if isinstance(row, UnavailableRow):
            where = f" in {row.failed_probe}" if row.failed_probe else ""
            self.progress.update(task, description=f"{label}: unavailable{where}")
        else:
            verdict = "invariant" if row.batch_invariance.batch_invariant else "NOT invariant"
            self.progress.update(task, description=f"{label}: {verdict} ({row.wall_s:.1f}s)")


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(evidence: Evidence) -> Table:
    """One line per row at the largest row count: the columns a reader decides on (mode and size go in
    the title, the full detail in the rendered report). Relative errors against float64; latencies in us
    (CUDA events, or "us (wall)" where the run timed with the host clock): fwd and net fwd+bwd
    per-sample synchronized, back to back ("st") and, where the run took them (CUDA), as CUDA-graph
    replays ("gr"); "of floor": the back-to-back forward's fraction of its memory floor, and below the table
    each forward floor a row beat the model of (harness/floors.py)."""
    sizes = sizes_of(evidence)
    size = sizes[-1] if sizes else "-"
    table = Table(title=f"{evidence.op} on {evidence.environment.gpu or evidence.environment.device}"
                        f"{' (quick)' if evidence.quick else ''}, R = {size}", box=box.SIMPLE_HEAD,
                  padding=(0, 0), pad_edge=False, caption_justify="left")
    timing = evidence.environment.timing
    timer = "us (wall)" if timing is not None and timing.timer == "wall_clock" else "us"
    results = [r.accuracy_latency.get(size) for rows in evidence.measured_modes().values()
               for r in rows.values() if isinstance(r, RowResult)]
    graph = any(r is not None and (r.fwd_graph_us, r.fwd_bwd_net_graph_us) != (None, None) for r in results)
    columns = ("row", "invariant", "params repeat", "fwd rel err", "grad rel err", f"fwd {timer}",
               f"fwd st {timer}", f"net {timer}", f"net st {timer}", "of floor")
    if graph:  # a GPU run's CUDA-graph replays ("gr"), after the other times
        columns = columns[:-1] + (f"fwd gr {timer}", f"net gr {timer}") + columns[-1:]
    blanks = len(columns) - 2
    for column in columns:
        # fold, never cut: a name or a number must be read whole at any terminal width
        table.add_column(column, justify="left" if column == "row" else "right", overflow="fold")
    from h3bench.harness.gate import beyond_rfc_failures, what_failed

    unavailable, not_invariant, lowered, beyond = [], [], {}, []
    for mode, rows in evidence.results.items():
        if isinstance(rows, UnavailableMode):
            table.add_row(f"{mode}/-", "[yellow]-[/]", *[""] * blanks)
            unavailable.append(f"mode {mode}: {rows.unavailable}")
            continue
        for name, row in rows.items():
            label = name if len(evidence.results) == 1 else f"{mode}/{name}"
            if isinstance(row, UnavailableRow):
                table.add_row(label, "[yellow]-[/]", *[""] * blanks)
                unavailable.append(f"{label}: {row.unavailable}")
                continue
            bi = row.batch_invariance
            if not bi.batch_invariant:  # the summary names the checks that failed
                not_invariant.append((label, what_failed(bi, located=False) or ["recorded not invariant"]))
            elif beyond_rfc_failures(bi, located=False):  # invariant by the RFC's probes, not by h3bench's
                beyond.append((label, beyond_rfc_failures(bi, located=False)))
            result = row.accuracy_latency.get(size) or next(iter(row.accuracy_latency.values()))
            grads = result.grad_rel_err or {}
            record = result.fwd_floor_lowered
            if record is not None:
                lowered[(mode, record.row, record.key)] = (
                    f"fwd floor lowered{'' if len(evidence.results) == 1 else f' ({mode})'}: {record.row}'s "
                    f"{record.key} {record.measured_us:.1f} us is below the read/write model's "
                    f"{result.fwd_floor_model_us:.1f} us (model / measured = {record.model_fraction:.2f})")
            table.add_row(
                label, "[green]yes[/]" if bi.batch_invariant else "[red]no[/]",
                {True: "yes", False: "[red]no[/]", None: "n/a"}[bi.params_repeatable],
                _fmt(result.fwd_rel_err, ".1e"), _fmt(max(grads.values()) if grads else None, ".1e"),
                _fmt(result.fwd_us, ".0f"), _fmt(result.fwd_stream_us, ".0f"), _fmt(result.fwd_bwd_net_us, ".0f"),
                _fmt(result.fwd_bwd_net_stream_us, ".0f"),
                *((_fmt(result.fwd_graph_us, ".0f"), _fmt(result.fwd_bwd_net_graph_us, ".0f")) if graph else ()),
                _fmt(result.fwd_stream_floor_fraction, ".0%"))
    captions = [f"not invariant: {label}: {'; '.join(failed)}" for label, failed in not_invariant]
    captions += [f"invariant by the RFC's probes, not by h3bench's: {label}: {'; '.join(failed)}"
                 for label, failed in beyond]
    captions += lowered.values()
    if unavailable:
        captions.append("unavailable (-): " + "; ".join(unavailable))
    if captions:
        table.caption = escape("\n".join(captions))  # reasons are text, not markup
    return table
