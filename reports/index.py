"""One page linking several ops' evidence files (`h3bench run --op all`, `h3bench index`): per op and
mode, each row's verdict and its latency at the op's largest size, with links to the op's own report."""
from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from h3bench.harness import schema
from h3bench.harness.schema import SKIPPED, RowResult, UnavailableMode, UnavailableRow
from h3bench.reports import fmt
from h3bench.reports.table import md_escape


@dataclass(frozen=True)
class IndexRow:
    op: str
    mode: str
    row: str
    verdict: str          # "invariant", "NOT invariant: <why>", "unavailable: <reason>"
    size: Optional[str]
    fwd_us: Optional[float]
    net_us: Optional[float]
    file: str             # the evidence file, relative to the index


def _verdict(row) -> str:
    from h3bench.reports.verdicts import failure_summary

    if isinstance(row, UnavailableRow):
        return row.unavailable if row.skipped else f"unavailable: {row.unavailable}"
    if row.batch_invariance.batch_invariant:
        beyond = failure_summary(row)  # a probe beyond the RFC's failed
        return f"invariant by the RFC's probes, not by h3bench's: {beyond}" if beyond else "invariant"
    return f"NOT invariant: {failure_summary(row)}"


def index_rows(paths: Sequence[Path], out_dir: Path) -> list[IndexRow]:
    from h3bench.harness.semantics import is_sweep

    rows = []
    for path in paths:
        link = os.path.relpath(Path(path).resolve(), Path(out_dir).resolve())
        try:
            data = schema.read_json(path)
            if is_sweep(data):  # the norm_modulate shape sweep: timings only, listed with a link
                rows.append(IndexRow("norm_modulate", "-", "shape sweep", "timings only (not an audit)", None,
                                     None, None, link))
                continue
            evidence = schema.from_json(data)
        except FileNotFoundError:
            raise ValueError(f"{path}: no such file") from None
        except OSError as exc:  # a folder (schema's words), a file it may not read (the system's)
            raise ValueError(f"{path}: {exc.strerror or exc}") from None
        except (schema.SchemaError, ValueError) as exc:  # which of several files is at fault
            raise ValueError(f"{path}: {exc}") from None
        sizes = schema.sizes_of(evidence)
        size = sizes[-1] if sizes else None
        for mode, found in evidence.results.items():
            if isinstance(found, UnavailableMode):
                rows.append(IndexRow(evidence.op, mode, "-", f"mode unavailable: {found.unavailable}", None, None,
                                     None, link))
                continue
            for name, row in found.items():
                result = row.accuracy_latency.get(size) if isinstance(row, RowResult) and size else None
                rows.append(IndexRow(evidence.op, mode, name, _verdict(row), size,
                                     result.fwd_us if result else None,
                                     result.fwd_bwd_net_us if result else None, link))
    return rows


def render_markdown(rows: Sequence[IndexRow]) -> str:
    out = ["# h3bench evidence index", "",
           "Latencies at each op's largest measured size, per-sample synchronized (the prior art's method).", "",
           "| op | mode | row | verdict | size | fwd us | net fwd+bwd us | evidence |",
           "| --- | --- | --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        out.append(f"| {r.op} | {r.mode} | {r.row} | {md_escape(r.verdict)} | {r.size or '-'} | "
                   f"{fmt.us(r.fwd_us)} | {fmt.us(r.net_us)} | [{Path(r.file).name}]({r.file}) |")
    return "\n".join(out) + "\n"


def render_html(rows: Sequence[IndexRow]) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8"><title>h3bench evidence index</title>',
           "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
           "td,th{border:1px solid #ccc;padding:3px 8px}td.num{text-align:right}"
           ".no{color:#b00}.yes{color:#070}.na{color:#777}</style></head><body>",
           "<h1>h3bench evidence index</h1>",
           "<p>Latencies at each op's largest measured size, per-sample synchronized (the prior art's method).</p>",
           "<table><tr><th>op</th><th>mode</th><th>row</th><th>verdict</th><th>size</th><th>fwd us</th>"
           "<th>net fwd+bwd us</th><th>evidence</th></tr>"]
    for r in rows:
        unjudged = r.verdict.startswith(("unavailable", "mode unavailable", SKIPPED))
        cls = "yes" if r.verdict == "invariant" else "na" if unjudged else "no"
        report = Path(r.file).with_suffix(".html")
        out.append(f"<tr><td>{e(r.op)}</td><td>{e(r.mode)}</td><td>{e(r.row)}</td>"
                   f'<td class="{cls}">{e(r.verdict)}</td><td class="num">{e(r.size or "-")}</td>'
                   f'<td class="num">{e(fmt.us(r.fwd_us))}</td><td class="num">{e(fmt.us(r.net_us))}</td>'
                   f'<td><a href="{e(str(report))}">{e(report.name)}</a> '
                   f'(<a href="{e(r.file)}">json</a>)</td></tr>')
    out += ["</table></body></html>"]
    return "\n".join(out) + "\n"


def write_index(paths: Sequence[Path], out_dir: Path) -> list[Path]:
    """index.md and index.html in `out_dir` for the evidence files `paths`."""
    if not paths:
        raise ValueError("index needs at least one evidence file")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = index_rows([Path(p) for p in paths], out_dir)
    md = schema.write_atomic(out_dir / "index.md", render_markdown(rows))
    page = schema.write_atomic(out_dir / "index.html", render_html(rows))
    return [md, page]
