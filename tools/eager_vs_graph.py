"""Our kernels as users call them: per op, size and figure, our row eager (back to back, the host's cost
included), our row replayed from a CUDA graph (the GPU work alone), and the fastest other row eager, from
evidence files of one run on one GPU (`h3bench run --op all`; nothing is re-measured).

    python -m tools.eager_vs_graph reports/evidence/{norm_modulate,timestep_sinusoid,timestep_mlp,\
        adaln_projection,adaln_row_gather,gate_residual,final_adaln_out}_h100.json [--markdown]

The figures are the files' back-to-back (`*_stream_us`) and graph (`*_graph_us`) medians, forward and net
forward+backward (forward only for a row without a backward). "Other rows" are those measured against
the same float64 reference as ours (tools/targets.py `same_reference`: a row of part of the op neither
computes nor costs what ours does), in the plain mode. Per line: whether ours is no slower than every
other row eager, and ours eager over ours graph (host cost over GPU time: 1.00 means the host keeps
ahead of the GPU). The summary counts the comparisons ours loses and, at each op's largest size, where
ours eager is above 1.25x its graph replay.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from h3bench.harness import schema
from h3bench.harness.schema import RowResult
from tools.targets import OURS, measured_rows, same_reference

FIGURES = (("fwd", "fwd_stream_us", "fwd_graph_us"), ("net", "fwd_bwd_net_stream_us", "fwd_bwd_net_graph_us"))
HOST_BOUND = 1.25  # ours eager above this many times its graph replay: the host paces the row


@dataclass(frozen=True)
class Line:
    op: str
    size: str
    figure: str                 # "fwd" | "net"
    ours: float                 # eager, back to back
    ours_graph: Optional[float]
    best: Optional[str]         # the fastest other row, eager
    best_us: Optional[float]

    @property
    def ahead(self) -> Optional[bool]:
        """Ours no slower than every other row eager; None without another row."""
        return None if self.best_us is None else self.ours <= self.best_us

    @property
    def host_ratio(self) -> Optional[float]:
        return None if not self.ours_graph else self.ours / self.ours_graph


def _value(row: RowResult, size: str, key: str) -> Optional[float]:
    found = row.accuracy_latency.get(size)
    return None if found is None else getattr(found, key, None)


def lines(evidence: schema.Evidence) -> list[Line]:
    """One line per size and figure of our row in the file's plain mode; none without our row."""
    rows = measured_rows(evidence)
    if OURS not in rows:
        return []
    rows = same_reference(rows)
    ours = rows[OURS]
    figures = FIGURES if ours.has_backward else FIGURES[:1]
    found = []
    for size in sorted(ours.accuracy_latency, key=int):
        for figure, eager, graph in figures:
            mine = _value(ours, size, eager)
            if mine is None:
                continue
            others = {name: _value(row, size, eager) for name, row in rows.items()
                      if name != OURS and (figure == "fwd" or row.has_backward)}
            others = {name: us for name, us in others.items() if us is not None}
            best = min(others, key=others.get) if others else None
            found.append(Line(evidence.op, size, figure, mine, _value(ours, size, graph), best,
                              others.get(best) if best else None))
    return found


def _us(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(found: Sequence[Line], markdown: bool) -> str:
    head = ["op", "size", "figure", "ours eager us", "ours graph us", "eager / graph", "fastest other eager",
            "ours no slower?"]
    body = [[l.op, l.size, l.figure, _us(l.ours), _us(l.ours_graph),
             "-" if l.host_ratio is None else f"{l.host_ratio:.2f}",
             "-" if l.best is None else f"{l.best} {_us(l.best_us)}",
             {True: "yes", False: "NO", None: "-"}[l.ahead]] for l in found]
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        out += ["| " + " | ".join(cells) + " |" for cells in body]
    else:
        widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
        out = ["  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in [head, *body]]
    lost = [l for l in found if l.ahead is False]
    largest = {}
    for l in found:
        if l.op not in largest or int(l.size) > int(largest[l.op]):
            largest[l.op] = l.size
    host_bound = [l for l in found if l.size == largest[l.op] and l.host_ratio is not None and l.host_ratio > HOST_BOUND]
    out += ["", f"ours behind some row eager in {len(lost)} of {sum(l.ahead is not None for l in found)} comparisons"
            + (": " + ", ".join(f"{l.op} {l.size} {l.figure}" for l in lost) if lost else ""),
            f"at the largest size, ours eager above {HOST_BOUND}x its graph replay: "
            + (", ".join(f"{l.op} {l.figure} {l.host_ratio:.2f}x" for l in host_bound) or "none")]
    return "\n".join(out)


def one_run(files: Sequence[schema.Evidence]) -> Optional[str]:
    """Why the files are not one run's on one GPU (an op twice, other commits or GPUs), or None: timings
    compare only within one run on one card."""
    ops = [e.op for e in files]
    twice = sorted({op for op in ops if ops.count(op) > 1})
    if twice:
        return f"two files of {', '.join(twice)}: give one run's files, one per op"
    runs = {(e.h3bench_commit, e.environment.gpu) for e in files}
    if len(runs) > 1:
        return "files of several runs: " + "; ".join(f"{commit} on {gpu}" for commit, gpu in sorted(runs, key=str))
    return None


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="evidence files of one run, one per op")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args(argv)
    files = [schema.load(path) for path in args.files]
    problem = one_run(files)
    if problem is not None:
        parser.error(problem)
    print(render([line for evidence in files for line in lines(evidence)], args.markdown))


if __name__ == "__main__":
    main()
