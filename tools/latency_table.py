"""Markdown tables of an evidence file's verdicts and latencies, every timing, for notes and READMEs.

    python -m tools.latency_table reports/evidence/norm_modulate_h200.json [--sizes 4097,32768]

One line per mode and row: the RFC's verdict, the probes beyond the RFC's that found a difference (each
one's failed checks as the gate words them, without the location), then per size the forward and the net
forward+backward, each per-sample synchronized / back to back (stream) / CUDA-graph replay (where the file
has graph figures), in microseconds, and the stream figures' fraction of the memory floor. Where the
synchronized figure is far above the graph replay, the host's cost (launches, autograd) paces the row.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from h3bench.harness import schema
from h3bench.harness.gate import beyond_rfc_failures
from h3bench.harness.schema import RowResult, UnavailableMode
from h3bench.reports import fmt


def timings(sync, stream, graph) -> str:
    """sync / stream, and / graph where the figure was graph-timed."""
    text = f"{fmt.us(sync)} / {fmt.us(stream)}"
    return text if graph is None else f"{text} / {fmt.us(graph)}"


def graph_timed(evidence: schema.Evidence) -> bool:
    """Whether any measured row of the file has a graph figure (files before graph timing have none)."""
    measured = [row for rows in evidence.results.values() if not isinstance(rows, UnavailableMode)
                for row in rows.values() if isinstance(row, RowResult)]
    return any(r.fwd_graph_us is not None for row in measured for r in row.accuracy_latency.values())


def table(evidence: schema.Evidence, sizes: list[str]) -> str:
    graphs = " / graph" if graph_timed(evidence) else ""
    head = "| mode | row | verdict | " + " | ".join(
        f"R={s} fwd sync / stream{graphs} (floor) | R={s} net f+b sync / stream{graphs} (floor)" for s in sizes) + " |"
    out = [head, "|" + " --- |" * (3 + 2 * len(sizes))]
    for mode, rows in evidence.results.items():
        if isinstance(rows, UnavailableMode):
            out.append(f"| {mode} | - | mode unavailable: {rows.unavailable} |" + " |" * (2 * len(sizes)))
            continue
        for name, row in rows.items():
            if not isinstance(row, RowResult):
                out.append(f"| {mode} | {name} | unavailable: {row.unavailable.replace('|', '/')} |"
                           + " - |" * (2 * len(sizes)))
                continue
            bi = row.batch_invariance
            verdict = "invariant" if bi.batch_invariant else "NOT invariant"
            verdict += {True: ", params repeat", False: ", params do NOT repeat", None: ""}[bi.params_repeatable]
            beyond = beyond_rfc_failures(bi, located=False)
            verdict += "; beyond the RFC: " + "; ".join(beyond) if beyond else ""
            cells = []
            for size in sizes:
                r = row.accuracy_latency.get(size)
                if r is None:
                    cells += ["-", "-"]
                    continue
                cells.append(f"{timings(r.fwd_us, r.fwd_stream_us, r.fwd_graph_us)} "
                             f"({fmt.floor_pct(r.fwd_stream_floor_fraction)})")
                cells.append(f"{timings(r.fwd_bwd_net_us, r.fwd_bwd_net_stream_us, r.fwd_bwd_net_graph_us)} "
                             f"({fmt.floor_pct(r.fwd_bwd_net_stream_floor_fraction)})" if row.has_backward else "-")
            out.append(f"| {mode} | {name} | {verdict} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--sizes", help="comma-separated row counts (default: every size in the file)")
    args = parser.parse_args()
    for path in args.files:
        evidence = schema.load(path)
        sizes = args.sizes.split(",") if args.sizes else schema.sizes_of(evidence)
        print(f"### {evidence.op} on {evidence.environment.gpu or 'CPU'} ({path.name})\n")
        print(table(evidence, sizes) + "\n")


if __name__ == "__main__":
    main()
