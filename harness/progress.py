"""Progress for long runs (rich bars on a terminal, a plain line per finished row elsewhere) and the summary
table printed at the end."""
from __future__ import annotations

import time
from typing import Optional

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from h3bench.harness.schema import Evidence, RowResult, UnavailableMode, UnavailableRow, is_skip, sizes_of


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
            self.progress.update(task, description=f"{label}: {row_verdict(row)}")
        else:
            self.progress.update(task, description=f"{label}: {row_verdict(row)} ({row.wall_s:.1f}s)")


def row_verdict(row) -> str:
    """A finished row in a word or two: invariant, NOT invariant, or why it has no verdict."""
    if isinstance(row, UnavailableRow):
        if is_skip(row.unavailable):
            return "skipped"
        return f"unavailable{f' in {row.failed_probe}' if row.failed_probe else ''}"
    return "invariant" if row.batch_invariance.batch_invariant else "NOT invariant"


class PlainObserver:
    """Progress where output is not a terminal (a pipe, a CI log, `| tee`): one plain line as each row's
    probes end (a measured row's verdict comes only after the rows' shared latency rounds, which can be
    minutes later on a GPU: without this line a slow op looked hung), as each row finishes (op, mode/row,
    verdict, wall seconds) and as each shared phase ends, written at once, so a log shows how far a long run
    got."""

    def __init__(self, console: Console, op: str):
        self.console = console
        self.op = op
        self.phase: Optional[tuple[str, float]] = None
        self.probing: Optional[tuple[str, float]] = None

    def _say(self, text: str) -> None:
        self.console.print(escape(f"{self.op} {text}"), highlight=False, soft_wrap=True)
        self.console.file.flush()

    def _probes_done(self) -> None:
        if self.probing is not None:
            label, started = self.probing
            self._say(f"{label}: probes done ({time.perf_counter() - started:.1f} s)")
            self.probing = None

    def row_started(self, mode: str, name: str, totals) -> None:
        self._probes_done()
        self.probing = (f"{mode}/{name}", time.perf_counter())

    def probe_started(self, probe): pass
    def advance(self, n): pass

    def row_finished(self, mode: str, name: str, row) -> None:
        if self.probing is not None and self.probing[0] == f"{mode}/{name}":
            self.probing = None  # it ended before its probes (unavailable): its verdict line says so
        wall = "-" if row.wall_s is None else f"{row.wall_s:.1f}"
        self._say(f"{mode}/{name}: {row_verdict(row)} ({wall} s)")

    def phase_started(self, mode: str, label: str, total: int) -> None:
        self._probes_done()
        self.phase = (f"{mode}: {label}", time.perf_counter())

    def phase_finished(self) -> None:
        if self.phase is not None:
            label, started = self.phase
            self._say(f"{label}: done ({time.perf_counter() - started:.1f} s)")
            self.phase = None


def _label(mode: str, name: str, several: bool) -> str:
    """A row's name in the summary: with several modes, `mode/row`, without the mode tag a row's evidence
    name carries (`diffusers[vllm]` under vllm: Op.mode_tagged_rows)."""
    return f"{mode}/{name.removesuffix(f'[{mode}]')}" if several else name


def _latency_note(timing, wall: bool, graph: bool) -> str:
    """What the latency columns are: unit, clock and samples per figure."""
    clock = "host wall clock" if wall else "CUDA events"
    samples = "" if timing is None else f", {timing.reps} sample{'s' if timing.reps != 1 else ''} per figure"
    rough = " (rough)" if timing is not None and timing.reps == 1 else ""
    figures = "fwd: forward; net: forward+backward; st: back to back" + ("; gr: CUDA-graph replay" if graph else "")
    return f"latencies in us: {clock}{samples}{rough}; {figures}"


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(evidence: Evidence) -> Table:
    """One line per row at the largest batch of the accuracy/latency probe: the columns a reader decides on
    (mode and size go in the title, the full detail in the rendered report). Relative errors against
    float64; latencies in us (CUDA events, or the host's wall clock, said in the caption with the samples a
    figure took): fwd and net fwd+bwd per-sample synchronized, back to back ("st") and, where the run took
    them (CUDA), as CUDA-graph replays ("gr"); "of floor" (on a GPU only: a CPU has no memory floor worth
    the name): the back-to-back forward's fraction of its memory floor, and below the table each forward
    floor a row beat the model of (harness/floors.py).

    Row names are never broken (their column takes its width); the number columns have short two-line
    headers and no padding, so the table fits a 120-column terminal."""
    sizes = sizes_of(evidence)
    size = sizes[-1] if sizes else "-"
    on_gpu = evidence.environment.gpu is not None
    table = Table(title=f"{evidence.op} on {evidence.environment.gpu or evidence.environment.device}"
                        f"{' (quick plan)' if evidence.quick else ''}: errors and latencies at a batch of {size} rows",
                  box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, caption_justify="left")
    timing = evidence.environment.timing
    wall = timing is not None and timing.timer == "wall_clock"
    results = [r.accuracy_latency.get(size) for rows in evidence.measured_modes().values()
               for r in rows.values() if isinstance(r, RowResult)]
    graph = any(r is not None and (r.fwd_graph_us, r.fwd_bwd_net_graph_us) != (None, None) for r in results)
    columns = ["invariant", "params\nrepeat", "fwd rel\nerr", "grad rel\nerr", "fwd\nus", "fwd st\nus", "net\nus",
               "net st\nus"]
    if graph:  # a GPU run's CUDA-graph replays ("gr"), after the other times
        columns += ["fwd gr\nus", "net gr\nus"]
    if on_gpu:
        columns += ["of\nfloor"]
    blanks = len(columns) - 1
    several = len(evidence.results) > 1
    names = [_label(mode, name, several) for mode, rows in evidence.results.items()
             for name in (rows if isinstance(rows, dict) else {"-": None})]
    # a name a user types back: one line, its full width, never folded mid-word
    table.add_column("row", justify="left", no_wrap=True, min_width=max(map(len, names), default=3))
    for column in columns:
        table.add_column(column, justify="right", overflow="fold")
    from h3bench.harness.gate import beyond_rfc_failures, what_failed

    unavailable, not_invariant, lowered, beyond, partial = [], [], {}, [], []
    for mode, rows in evidence.results.items():
        if isinstance(rows, UnavailableMode):
            table.add_row(escape(f"{mode}/-"), "[yellow]-[/]", *[""] * blanks)
            unavailable.append(f"mode {mode}: {rows.unavailable}")
            continue
        for name, row in rows.items():
            label = _label(mode, name, several)
            if isinstance(row, UnavailableRow):
                table.add_row(escape(label), "[yellow]-[/]", *[""] * blanks)
                unavailable.append(f"{label}: {row.unavailable}")
                continue
            if row.reference is not None:
                partial.append(f"{label} ({row.reference})")
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
                escape(label), "[green]yes[/]" if bi.batch_invariant else "[red]no[/]",
                {True: "yes", False: "[red]no[/]", None: "n/a"}[bi.params_repeatable],
                _fmt(result.fwd_rel_err, ".1e"), _fmt(max(grads.values()) if grads else None, ".1e"),
                _fmt(result.fwd_us, ".0f"), _fmt(result.fwd_stream_us, ".0f"), _fmt(result.fwd_bwd_net_us, ".0f"),
                _fmt(result.fwd_bwd_net_stream_us, ".0f"),
                *((_fmt(result.fwd_graph_us, ".0f"), _fmt(result.fwd_bwd_net_graph_us, ".0f")) if graph else ()),
                *((_fmt(result.fwd_stream_floor_fraction, ".0%"),) if on_gpu else ()))
    captions = [_latency_note(timing, wall, graph)]
    captions += [f"not invariant: {label}: {'; '.join(failed)}" for label, failed in not_invariant]
    captions += [f"invariant by the RFC's probes, not by h3bench's: {label}: {'; '.join(failed)}"
                 for label, failed in beyond]
    captions += lowered.values()
    if partial:
        captions.append("errors against the reference of the part of the op the row computes: " + "; ".join(partial))
    skipped = [line for line in unavailable if is_skip(line.split(": ", 1)[-1])]
    unavailable = [line for line in unavailable if line not in skipped]
    if skipped:
        captions.append("skipped (-): " + "; ".join(skipped))
    if unavailable:
        captions.append("unavailable (-): " + "; ".join(unavailable))
    if captions:
        table.caption = escape("\n".join(captions))  # reasons are text, not markup
    return table
