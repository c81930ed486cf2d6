"""The evidence file as one DataFrame, and as Markdown and self-contained HTML tables.

`build_table` holds raw values (one row per mode and implementation); the renderers format them
through `reports.fmt`, so every displayed number has exactly one precision.
"""
from __future__ import annotations

import base64
import html
import math
from typing import Any, Mapping, Optional, Sequence, Union

import pandas as pd

from h3bench.harness.probes import registry
from h3bench.harness.schema import (Evidence, RowResult, SizeResult, UnavailableMode, UnavailableRow, size_key,
                            sizes_of)
from h3bench.reports import fmt, verdicts
from h3bench.reports.control_section import TITLE as CONTROL_TITLE
from h3bench.reports.control_section import control_summary, control_tables
from h3bench.reports.table_spec import Cell, TableSpec

GRAD_ORDER = ("x", "w", "sh", "sc")
# SizeResult fields copied into the frame as `<size>/<field>`; gradients become `<size>/grad_<g>_err`.
SIZE_FIELDS = ("fwd_rel_err", "fwd_us", "fwd_bwd_us", "fwd_bwd_net_us", "fwd_us_repeat",
               "fwd_bwd_us_repeat", "fwd_bwd_net_us_repeat", "fwd_floor_us", "fwd_bwd_floor_us",
               "fwd_floor_fraction", "fwd_bwd_floor_fraction", "fwd_bwd_net_floor_fraction",
               "fwd_stream_us", "fwd_bwd_stream_us", "fwd_bwd_net_stream_us", "fwd_stream_us_repeat",
               "fwd_bwd_stream_us_repeat", "fwd_bwd_net_stream_us_repeat", "fwd_stream_floor_fraction",
               "fwd_bwd_stream_floor_fraction", "fwd_bwd_net_stream_floor_fraction",
               "fwd_graph_us", "fwd_bwd_graph_us", "fwd_bwd_net_graph_us", "fwd_graph_us_repeat",
               "fwd_bwd_graph_us_repeat", "fwd_bwd_net_graph_us_repeat",
               "fwd_peak_bytes", "fwd_bwd_peak_bytes", "fwd_bwd_net_peak_bytes")
GRAPH_UNAVAILABLE = "_graph_unavailable"  # `<size>/<figure>_graph_unavailable`: why a figure has no graph time
FIGURE_LABELS = {"fwd": "fwd", "fwd_bwd": "fwd+bwd", "fwd_bwd_net": "fwd+bwd net"}
BASE_COLUMNS = ("mode", "implementation", "status", "source", "reason", "failed_probe", "has_backward",
                "batch_invariant", "failed_checks", "params_repeatable", "wall_s", "compile_s", "compiles", "reference")


def _measured_rows(evidence: Evidence, mode: Optional[str]):
    for m, rows in evidence.measured_modes().items():
        if mode is None or m == mode:
            yield from (row for row in rows.values() if isinstance(row, RowResult))


def grads_of(evidence: Evidence, mode: Optional[str] = None) -> list[str]:
    found: set[str] = set()
    for row in _measured_rows(evidence, mode):
        for result in row.accuracy_latency.values():
            found.update(result.grad_rel_err or {})
    known = [g for g in GRAD_ORDER if g in found]
    return known + sorted(found - set(GRAD_ORDER))


def _size_values(size: str, result: SizeResult) -> dict[str, Any]:
    values: dict[str, Any] = {f"{size}/{name}": getattr(result, name) for name in SIZE_FIELDS}
    for grad, value in (result.grad_rel_err or {}).items():
        values[f"{size}/grad_{grad}_err"] = value
    for figure, reason in (result.graph_unavailable or {}).items():
        values[f"{size}/{figure}{GRAPH_UNAVAILABLE}"] = reason
    for key, spread in (result.spread or {}).items():
        values[f"{size}/{key}_p10"] = spread.p10
        values[f"{size}/{key}_p90"] = spread.p90
    return values


def _column_order(column: str) -> tuple:
    size, name = column.split("/", 1)
    if name.startswith("grad_"):
        grad = name[len("grad_"):-len("_err")]
        rank = (1, GRAD_ORDER.index(grad) if grad in GRAD_ORDER else len(GRAD_ORDER), grad)
    elif name.endswith(("_p10", "_p90")):
        rank = (3, 0, name)
    elif name.endswith(GRAPH_UNAVAILABLE):
        rank = (4, 0, name)
    else:
        rank = (0 if name == "fwd_rel_err" else 2, SIZE_FIELDS.index(name), "")
    return size_key(size), rank


def build_table(evidence: Evidence) -> pd.DataFrame:
    """One row per (mode, implementation), raw values; absent measurements are None/NaN."""
    records = []
    for mode, rows in evidence.measured_modes().items():
        for name, row in rows.items():
            record: dict[str, Any] = {"mode": mode, "implementation": name, "source": row.source,
                                      "wall_s": row.wall_s}
            record["compile_s"] = row.compile_s
            if isinstance(row, UnavailableRow):
                record.update(status="unavailable", reason=row.unavailable, failed_probe=row.failed_probe)
            else:
                bi = row.batch_invariance
                record.update(status="measured", has_backward=row.has_backward,
                              batch_invariant=bi.batch_invariant, failed_checks=verdicts.failure_summary(row),
                              params_repeatable=bi.params_repeatable, compiles=row.compiles,
                              reference=row.reference)
                for size, result in row.accuracy_latency.items():
                    record.update(_size_values(size, result))
            records.append(record)
    frame = pd.DataFrame.from_records(records)
    for column in BASE_COLUMNS:
        if column not in frame:
            frame[column] = None
    # Keep only measured columns: a key no row has (e.g. net times in the prior art) is no column.
    size_columns = [c for c in frame.columns if "/" in c and frame[c].notna().any()]
    size_columns.sort(key=_column_order)
    return frame[list(BASE_COLUMNS) + size_columns].astype(object).where(frame.notna(), None)


# --- table specs shared by the Markdown and HTML renderers -------------------------------------------

def _get(record: Mapping[str, Any], key: str) -> Any:
    value = record.get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _verdict_cell(value: Optional[bool]) -> Cell:
    return Cell(fmt.tri(value), "na" if value is None else ("yes" if value else "no"))


def mode_tables(evidence: Evidence, mode: str, frame: Optional[pd.DataFrame] = None) -> list[TableSpec]:
    frame = build_table(evidence) if frame is None else frame
    part = frame[frame["mode"] == mode]
    measured = [r for r in part.to_dict("records") if r["status"] == "measured"]
    unavailable = [r for r in part.to_dict("records") if r["status"] == "unavailable"]
    tables: list[TableSpec] = []
    if measured:
        tables.append(TableSpec(
            "Batch invariance",
            ["implementation", "batch-invariant", "failed checks", "params repeatable", "backward", "source"],
            [[Cell(r["implementation"]), _verdict_cell(r["batch_invariant"]), Cell(r["failed_checks"] or ""),
              _verdict_cell(r["params_repeatable"]), Cell(fmt.tri(r["has_backward"])),
              Cell(r["source"] or "")] for r in measured],
            note="Bitwise comparison, no tolerance. params repeatable: n.a. when the implementation has no "
                 "parameter gradients or they are not measured."))
        beyond = _beyond_rfc_table(evidence, mode)
        if beyond is not None:
            tables.append(beyond)
        tables.append(_accuracy_table(evidence, mode, part, measured))
        tables.extend(_latency_table(size, part, measured, _floor_note(evidence, mode, size))
                      for size in sizes_of(evidence, mode))
    compiled = [r for r in part.to_dict("records") if _get(r, "compile_s") is not None]
    if compiled:
        tables.append(_compile_table(compiled))
    if unavailable:
        tables.append(TableSpec(
            "Unavailable", ["implementation", "reason", "failed probe", "source"],
            [[Cell(r["implementation"]), Cell(r["reason"]), Cell(_get(r, "failed_probe") or fmt.MISSING),
              Cell(_get(r, "source") or fmt.MISSING)] for r in unavailable]))
    return tables


def _compile_table(compiled: list[dict]) -> TableSpec:
    rows = [[Cell(r["implementation"]), Cell(r["status"]), Cell(fmt.seconds(_get(r, "compile_s")), "num"),
             Cell(str(int(_get(r, "compiles"))) if _get(r, "compiles") is not None else fmt.MISSING, "num")]
            for r in compiled]
    return TableSpec("Compile time", ["implementation", "status", "compile s", "compilations"], rows,
                     note="Rows that compile on their calls (torch.compile): seconds in Dynamo/AOTAutograd/"
                          "Inductor compilations over the row's probes and timing (the first compile, each "
                          "recompile for a new shape class or grad mode, the lazily compiled backward), and "
                          "how many; a kernel's runtime autotuning at first launch is not included.",
                     beside=True)


_STATUS_CLASS = {verdicts.Status.PASS: "yes", verdicts.Status.FAIL: "no", verdicts.Status.NA: "na"}


def _beyond_rfc_table(evidence: Evidence, mode: str) -> Optional[TableSpec]:
    """The probes beyond the RFC's, one column each (status and counts); None when no row has any."""
    rows = [(name, row) for name, row in evidence.rows(mode).items() if isinstance(row, RowResult)]
    if not any(row.batch_invariance.beyond_rfc for _, row in rows):
        return None
    probes = registry.beyond_rfc()
    columns = [spec.label for spec in probes]
    body = []
    for name, row in rows:
        by_name = {c.name: c for c in verdicts.checks(row)}
        body.append([Cell(name)] + [Cell(f"{by_name[c].status.value}: {by_name[c].detail}",
                                         _STATUS_CLASS[by_name[c].status]) for c in columns])
    return TableSpec("Beyond the RFC's probes", ["implementation", *columns], body,
                     note="Not part of batch-invariant (the RFC's verdict). "
                          + "; ".join(f"{spec.label}: {spec.note}" for spec in probes) + ".")


def _accuracy_table(evidence: Evidence, mode: str, part: pd.DataFrame, measured: list[dict]) -> TableSpec:
    sizes = sizes_of(evidence, mode)
    grads = grads_of(evidence, mode)
    headers, groups = ["implementation"], [("", 1)]
    keys: list[str] = []
    for size in sizes:
        cols = [(f"{size}/fwd_rel_err", "fwd")] + [(f"{size}/grad_{g}_err", f"grad {g}") for g in grads]
        keys += [k for k, _ in cols]
        headers += [h for _, h in cols]
        groups.append((f"R = {size}", len(cols)))
    def name(r: Mapping[str, Any]) -> str:  # a row of part of the op: against that part's reference
        reference = _get(r, "reference")
        return f"{r['implementation']} (against {reference})" if isinstance(reference, str) else r["implementation"]
    rows = [[Cell(name(r))] + [Cell(fmt.err(_get(r, k)), "num") for k in keys] for r in measured]
    return TableSpec("Accuracy (relative error vs float64 reference)", headers, rows, groups,
                     note="max|y - ref| / max|ref| on the same rounded inputs; — = not produced by the "
                          "implementation; (against X): the row computes part of the op, its errors are "
                          "against that part's reference X.")


def _spread_text(record: Mapping[str, Any], key: str) -> str:
    low, high = _get(record, f"{key}_p10"), _get(record, f"{key}_p90")
    return fmt.MISSING if low is None or high is None else f"{fmt.us(low)}–{fmt.us(high)}"


COPY_FLOOR_NOTE = ("% of floor = memory floor time / measured time (100% = moving the op's bytes at the measured "
                   f"copy bandwidth; {fmt.BEAT_FLOOR}: the measured time was below that floor).")
READ_WRITE_FLOOR_NOTE = ("% of floor = memory floor time / measured time; the floor: the op's bytes read at the "
                         "measured read bandwidth plus its bytes written at the measured write bandwidth, or the "
                         "fastest measured time where a row beat that model.")


def _floor_note(evidence: Evidence, mode: str, size: str) -> str:
    """How this size's floors were made: the copy floor of older files, or the read/write model with the
    rows that beat it (which row, which figure, by how much)."""
    if not evidence.environment.floor_model:
        return COPY_FLOOR_NOTE
    lowered = {}
    for row in evidence.rows(mode).values():
        result = row.accuracy_latency.get(size) if isinstance(row, RowResult) else None
        if result is None:
            continue
        for label, record, model in (("fwd", result.fwd_floor_lowered, result.fwd_floor_model_us),
                                     ("fwd+bwd", result.fwd_bwd_floor_lowered, result.fwd_bwd_floor_model_us)):
            if record is not None:
                lowered[(label, record.row, record.key)] = (
                    f"The {label} model's {fmt.us(model)} µs is no floor: {record.row}'s {record.key} took "
                    f"{fmt.us(record.measured_us)} µs (model / measured = {fmt.ratio(record.model_fraction)}), "
                    f"so that is the {label} floor")
    return " ".join([READ_WRITE_FLOOR_NOTE, *(f"{text}." for text in lowered.values())])


def _latency_table(size: str, part: pd.DataFrame, measured: list[dict], floor_note: str = COPY_FLOOR_NOTE) -> TableSpec:
    """One line per implementation and figure: the prior art's per-sample synchronized time and the
    back-to-back (stream) time, each a median with its p10–p90 and its second timing, and the fraction
    of the memory floor each reaches; where the file has them, the CUDA-graph replay's time and the
    step's peak memory."""
    figures = list(FIGURE_LABELS)
    graph = any(_get(r, f"{size}/{f}_graph_us") is not None or _get(r, f"{size}/{f}{GRAPH_UNAVAILABLE}")
                for r in measured for f in figures)
    peak = any(_get(r, f"{size}/{f}_peak_bytes") is not None for r in measured for f in figures)
    headers = ["implementation", "figure", "synchronized µs", "p10–p90", "repeat µs", "stream µs", "p10–p90",
               "repeat µs"] + (["graph µs", "p10–p90"] if graph else []) + [
               "floor µs", "% of floor (sync)", "% of floor (stream)"] + (["peak MiB"] if peak else [])
    rows, not_captured = [], []
    for r in measured:
        for figure, label in FIGURE_LABELS.items():
            sync, stream = f"{size}/{figure}_us", f"{size}/{figure}_stream_us"
            if _get(r, sync) is None and _get(r, stream) is None:
                continue
            floor = f"{size}/{'fwd' if figure == 'fwd' else 'fwd_bwd'}_floor_us"
            cells = [Cell(r["implementation"]), Cell(label), Cell(fmt.us(_get(r, sync)), "num"),
                     Cell(_spread_text(r, sync), "num"), Cell(fmt.us(_get(r, f"{sync}_repeat")), "num"),
                     Cell(fmt.us(_get(r, stream)), "num"), Cell(_spread_text(r, stream), "num"),
                     Cell(fmt.us(_get(r, f"{stream}_repeat")), "num")]
            if graph:
                replay, reason = f"{size}/{figure}_graph_us", _get(r, f"{size}/{figure}{GRAPH_UNAVAILABLE}")
                cells += [Cell("not captured" if reason else fmt.us(_get(r, replay)), "num"),
                          Cell(_spread_text(r, replay), "num")]
                if reason:
                    not_captured.append(f"{r['implementation']} {label}: {reason}")
            cells += [Cell(fmt.us(_get(r, floor)), "num"),
                      Cell(fmt.floor_pct(_get(r, f"{size}/{figure}_floor_fraction")), "num"),
                      Cell(fmt.floor_pct(_get(r, f"{size}/{figure}_stream_floor_fraction")), "num")]
            if peak:
                cells.append(Cell(fmt.mib(_get(r, f"{size}/{figure}_peak_bytes")), "num"))
            rows.append(cells)
    note = ("Medians in microseconds. synchronized: each sample from an idle device (the prior art's method; "
            "host cost included); stream: samples back to back (the device time when the host keeps ahead). "
            "repeat: the same figure timed again later in the run; rows are timed interleaved. "
            f"{floor_note} fwd+bwd: fresh leaves made inside the timed step (the prior art's figure); "
            "net: without that setup.")
    if graph:
        note += (" graph: the same step captured once in a CUDA graph and replayed, each replay synchronized "
                 "(the device work without the host cost).")
        if not_captured:
            note += " Not captured: " + "; ".join(not_captured) + "."
    if peak:
        note += (" peak MiB: what one step allocated at its peak beyond what was allocated before it "
                 "(torch.cuda.max_memory_allocated).")
    return TableSpec(f"Latency at R = {size} rows", headers, rows, note=note)


def header_fields(evidence: Evidence) -> list[tuple[str, str]]:
    env = evidence.environment
    gpu = env.gpu or "none (CPU)"
    if env.capability:
        gpu += f" (sm {'.'.join(str(c) for c in env.capability)})"
    commit = evidence.rl_kernel_commit or "unknown"
    if evidence.tracked_tree_dirty:
        commit += " (tracked tree dirty)"
    fields = [("op", evidence.op), ("RFC", evidence.rfc), ("GPU", gpu), ("torch", env.torch),
              ("CUDA", env.cuda or "none"), ("python", env.python), ("TF32", fmt.tri(env.tf32)),
              ("copy bandwidth", fmt.bandwidth(env.copy_bandwidth_gbps)),
              ("read bandwidth", fmt.rate(env.read_bandwidth_gbps, env.read_bandwidth_bytes,
                                          env.read_bandwidth_kernel)),
              ("write bandwidth", fmt.rate(env.write_bandwidth_gbps, env.write_bandwidth_bytes,
                                           env.write_bandwidth_kernel)),
              ("quick", "yes (reduced plan)" if evidence.quick else "no (full plan)"),
              ("rl_kernel commit", commit), ("h3bench commit", evidence.h3bench_commit or "not recorded")]
    if env.timing is not None:
        t = env.timing
        fields.append(("timing", f"{t.timer}; *_us {t.sample} per sample, *_stream_us {t.stream}; {t.reps} "
                                 f"samples x {t.repeats} timings after {t.warmup} warm-ups; {t.interleaved}"))
        if t.graph is not None:
            fields.append(("graph timing", f"*_graph_us: {t.graph}"))
        if t.flush_l2 is not None:
            fields.append(("L2 flush", f"on: a {fmt.mib(t.flush_bytes)} MiB buffer zeroed before "
                                       f"{t.flush_applies_to}" if t.flush_l2 else "off"))
    optional = [("bandwidth method", env.bandwidth_method), ("floor model", env.floor_model),
                ("driver", env.driver), ("host", env.host), ("created (UTC)", evidence.created_utc),
                ("command", evidence.command),
                ("wall time", None if evidence.wall_s is None else f"{evidence.wall_s:.0f} s")]
    return fields + [(k, v) for k, v in optional if v]


def mode_summary(evidence: Evidence, mode: str) -> str:
    found = evidence.results.get(mode)
    if isinstance(found, UnavailableMode):
        return f"Mode unavailable: {found.unavailable}"
    rows = evidence.rows(mode)
    measured = [n for n, r in rows.items() if isinstance(r, RowResult)]
    invariant = [n for n in measured if rows[n].batch_invariance.batch_invariant]
    text = f"{len(invariant)} of {len(measured)} measured implementations batch-invariant"
    if invariant:
        text += f" ({', '.join(invariant)})"
    skipped = sum(isinstance(r, UnavailableRow) and r.skipped for r in rows.values())
    unavailable = len(rows) - len(measured) - skipped
    return text + "".join(f"; {n} {what}" for n, what in ((unavailable, "unavailable"), (skipped, "skipped"))
                          if n) + "."


def _libraries(evidence: Evidence) -> str:
    libs = evidence.environment.libraries
    return ", ".join(f"{name} {version}" if version else f"{name} (absent)" for name, version in libs.items())


# --- Markdown -----------------------------------------------------------------------------------------

def md_escape(text: str) -> str:
    """Text as it reads in a Markdown table cell or list item: a '|' or a line break would end the cell, and
    '<' would open an HTML tag that renderers drop (a reason's "<sm_90a>"): backslash escapes, one line."""
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<").split())


def _md_table(table: TableSpec) -> str:
    headers = list(table.headers)
    if table.groups:
        # Markdown has no spanning headers: prefix each column with its group instead.
        labels = [label for label, span in table.groups for _ in range(span)]
        headers = [f"{g}: {h}" if g else h for g, h in zip(labels, headers)]
    lines = [f"### {table.title}", "", "| " + " | ".join(md_escape(h) for h in headers) + " |",
             "| " + " | ".join("---:" if c.cls == "num" else "---" for c in table.rows[0]) + " |"
             if table.rows else "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(md_escape(c.text) for c in row) + " |" for row in table.rows]
    if table.note:
        lines += ["", f"_{table.note}_"]
    return "\n".join(lines)


def render_markdown(evidence: Evidence, images: Optional[Mapping[str, str]] = None, show_control: bool = False) -> str:
    """`images` maps a caption to a relative path, linked after the tables; `show_control`: the negative
    control's section too (reports/control_section.py)."""
    frame = build_table(evidence)
    out = [f"# h3bench evidence: {evidence.op} on {evidence.environment.gpu or 'CPU'}", ""]
    out += [f"- **{k}**: {md_escape(v)}" for k, v in header_fields(evidence)]
    out += [f"- **libraries**: {md_escape(_libraries(evidence))}", ""]
    for mode in evidence.results:
        out += [f"## Mode `{mode}`", ""]
        mode_env = evidence.environment.mode_environment.get(mode) or {}
        if mode_env:
            shown = " ".join(str(mode_env).replace("`", "'").split())  # a code span: no escapes, one line
            out += [f"Mode environment: `{shown}`", ""]
        out += [mode_summary(evidence, mode), ""]
        for table in mode_tables(evidence, mode, frame):
            out += [_md_table(table), ""]
    if show_control:
        out += [f"## {CONTROL_TITLE}", "", md_escape(control_summary(evidence) or "No control recorded."), ""]
        out += [text for table in control_tables(evidence) for text in (_md_table(table), "")]
    for caption, path in (images or {}).items():
        out += [f"![{caption}]({path})", ""]
    return "\n".join(out).rstrip() + "\n"


# --- HTML ---------------------------------------------------------------------------------------------

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 24px 32px;
       color: #1d1d1f; font-size: 14px; line-height: 1.4; }
h1 { font-size: 22px; margin-bottom: 8px; } h2 { font-size: 18px; margin-top: 28px; }
h3 { font-size: 15px; margin: 20px 0 6px; }
table { border-collapse: collapse; margin-bottom: 4px; }
th, td { border: 1px solid #d0d0d5; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f4; font-weight: 600; white-space: nowrap; }
th.group { text-align: center; background: #e4e4ec; }
td.num { text-align: right; font-variant-numeric: tabular-nums; font-family: "DejaVu Sans Mono", monospace; }
td.yes { background: #dff3e2; color: #14532d; font-weight: 600; }
td.no { background: #fbe0e0; color: #7f1d1d; font-weight: 600; }
td.na { background: #eeeeee; color: #555; }
table.meta th { text-align: right; background: none; border: none; padding-right: 12px; white-space: nowrap; }
div.beside { display: flex; flex-wrap: wrap; gap: 0 32px; align-items: flex-start; }
p.summary { font-size: 15px; margin: 6px 0 4px; }
table.meta td { border: none; font-family: "DejaVu Sans Mono", monospace; }
p.note { color: #555; font-size: 12px; margin: 2px 0 12px; max-width: 1100px; }
figure { margin: 16px 0; } figcaption { color: #555; font-size: 12px; }
img { max-width: 100%; border: 1px solid #e0e0e0; }
"""


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _html_table(table: TableSpec) -> str:
    out = [f"<h3>{_e(table.title)}</h3>", "<table>"]
    if table.groups:
        out.append("<tr>" + "".join(f'<th class="group" colspan="{span}">{_e(label)}</th>'
                                    for label, span in table.groups) + "</tr>")
    out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in table.headers) + "</tr>")
    for row in table.rows:
        out.append("<tr>" + "".join(f'<td class="{c.cls}">{_e(c.text)}</td>' if c.cls else f"<td>{_e(c.text)}</td>"
                                    for c in row) + "</tr>")
    out.append("</table>")
    if table.note:
        out.append(f'<p class="note">{_e(table.note)}</p>')
    return "\n".join(out)


def _html_tables(tables: Sequence[TableSpec]) -> list[str]:
    out: list[str] = []
    run: list[str] = []
    for table in tables:
        if table.beside:
            run.append(f"<div>{_html_table(table)}</div>")
            continue
        if run:
            out.append('<div class="beside">' + "\n".join(run) + "</div>")
            run = []
        out.append(_html_table(table))
    if run:
        out.append('<div class="beside">' + "\n".join(run) + "</div>")
    return out


def _data_uri(image: Union[bytes, str]) -> str:
    data = image if isinstance(image, bytes) else open(image, "rb").read()
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def render_html(evidence: Evidence, images: Optional[Mapping[str, Union[bytes, str]]] = None,
                show_control: bool = False) -> str:
    """A self-contained page: inline CSS, PNGs (bytes or paths, keyed by caption) inlined as data URIs;
    `show_control`: the negative control's section too."""
    frame = build_table(evidence)
    title = f"h3bench evidence: {evidence.op} on {evidence.environment.gpu or 'CPU'}"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{_e(title)}</title>",
           f"<style>{CSS}</style></head><body>", f"<h1>{_e(title)}</h1>", '<table class="meta">']
    out += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in header_fields(evidence)]
    out += [f"<tr><th>libraries</th><td>{_e(_libraries(evidence))}</td></tr>", "</table>"]
    for mode in evidence.results:
        out.append(f"<h2>Mode <code>{_e(mode)}</code></h2>")
        mode_env = evidence.environment.mode_environment.get(mode) or {}
        if mode_env:
            out.append(f'<p class="note">Mode environment: <code>{_e(str(mode_env))}</code></p>')
        out.append(f'<p class="summary">{_e(mode_summary(evidence, mode))}</p>')
        out += _html_tables(mode_tables(evidence, mode, frame))
    if show_control:
        out.append(f"<h2>{_e(CONTROL_TITLE)}</h2>")
        out.append(f'<p class="summary">{_e(control_summary(evidence) or "No control recorded.")}</p>')
        out += _html_tables(control_tables(evidence))
    if images:
        out.append("<h2>Figures</h2>")
    for caption, image in (images or {}).items():
        out.append(f'<figure><img alt="{_e(caption)}" src="{_data_uri(image)}">'
                   f"<figcaption>{_e(caption)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
