"""Markdown tables of an evidence file's verdicts and latencies, both timings, for notes and READMEs.

    python -m tools.latency_table reports/evidence/norm_modulate_h200.json [--sizes 4097,32768]

One line per mode and row: the verdict, then per size the forward and the net forward+backward, each
per-sample synchronized / back to back (stream), in microseconds, and the stream figures' fraction of
the memory floor.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from h3bench.harness import schema
from h3bench.harness.schema import RowResult, UnavailableMode
from h3bench.reports import fmt


def table(evidence: schema.Evidence, sizes: list[str]) -> str:
    head = "| mode | row | verdict | " + " | ".join(
        f"R={s} fwd sync / stream (floor) | R={s} net f+b sync / stream (floor)" for s in sizes) + " |"
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
            cells = []
            for size in sizes:
                r = row.accuracy_latency.get(size)
                if r is None:
                    cells += ["-", "-"]
                    continue
                cells.append(f"{fmt.us(r.fwd_us)} / {fmt.us(r.fwd_stream_us)} ({fmt.floor_pct(r.fwd_stream_floor_fraction)})")
                cells.append(f"{fmt.us(r.fwd_bwd_net_us)} / {fmt.us(r.fwd_bwd_net_stream_us)} "
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
