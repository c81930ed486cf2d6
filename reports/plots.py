"""PNG figures of one evidence file: latency, accuracy, verdict grid.

Uses matplotlib's object API with an explicit Agg canvas instead of pyplot and `matplotlib.use`: no
display needed, and no global backend switched under a caller (a notebook importing this keeps its own).
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullFormatter
from PIL import Image  # matplotlib's own dependency

from h3bench.harness.schema import Evidence, RowResult, UnavailableRow
from h3bench.reports import fmt, verdicts
from h3bench.reports.table import grads_of, sizes_of

PathLike = Union[str, Path]
STATUS_COLOR = {verdicts.Status.PASS: "#a5d6a7", verdicts.Status.FAIL: "#ef9a9a", verdicts.Status.NA: "#e0e0e0"}
SERIES_COLOR = {"fwd": "#4c72b0", "fwd+bwd": "#dd8452", "fwd+bwd net": "#55a868", "fwd graph": "#8fa9d6",
                "fwd+bwd net graph": "#a3d0ae"}
# Sharp enough to read every label; with PALETTE, what keeps the committed evidence's plots small.
DPI = 90
# Flat fills, a few series colours and their antialiased edges: 64 colours look the same to the eye.
PALETTE = 64


@dataclass(frozen=True)
class Labeled:
    label: str
    row: Union[RowResult, UnavailableRow]


def _rows(evidence: Evidence) -> list[Labeled]:
    # One mode is the common case: then the implementation name alone is the label.
    several = len(evidence.results) > 1
    return [Labeled(f"{mode}/{name}" if several else name, row)
            for mode, rows in evidence.measured_modes().items() for name, row in rows.items()]


def _measured(evidence: Evidence) -> list[Labeled]:
    return [r for r in _rows(evidence) if isinstance(r.row, RowResult)]


def _save(fig: Figure, path: PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches itself to the figure
    drawn = io.BytesIO()
    fig.savefig(drawn, dpi=DPI, format="png", bbox_inches="tight")
    drawn.seek(0)
    # An opaque chart in a small palette: a fraction of the RGBA file's bytes; the HTML inlines these bytes too.
    with Image.open(drawn) as image:
        image.convert("RGB").quantize(colors=PALETTE).save(path, format="PNG", optimize=True)
    return path


def _empty(path: PathLike, title: str) -> Path:
    fig = Figure(figsize=(6, 2))
    ax = fig.subplots()
    ax.axis("off")
    ax.text(0.5, 0.5, f"{title}: no measured rows", ha="center", va="center")
    return _save(fig, path)


def _title(evidence: Evidence, what: str) -> str:
    return f"{evidence.op} on {evidence.environment.gpu or 'CPU'}: {what}"


def plot_latency(evidence: Evidence, path: PathLike) -> Path:
    """Grouped bars per implementation, one panel per row count; memory floors as black ticks."""
    rows, sizes = _measured(evidence), sizes_of(evidence)
    if not rows or not sizes:
        return _empty(path, "latency")
    fig = Figure(figsize=(max(8.0, 1.3 * len(rows) + 2), 3.8 * len(sizes)), layout="constrained")
    axes = fig.subplots(len(sizes), 1, squeeze=False)[:, 0]
    for ax, size in zip(axes, sizes):
        # (label, measured key, floor key): a net time is bounded by the same fwd+bwd floor.
        # The CUDA-graph replays (files from a GPU) beside their synchronized figures.
        series = [("fwd", "fwd_us", "fwd_floor_us"), ("fwd graph", "fwd_graph_us", "fwd_floor_us"),
                  ("fwd+bwd", "fwd_bwd_us", "fwd_bwd_floor_us"),
                  ("fwd+bwd net", "fwd_bwd_net_us", "fwd_bwd_floor_us"),
                  ("fwd+bwd net graph", "fwd_bwd_net_graph_us", "fwd_bwd_floor_us")]
        series = [s for s in series
                  if any(getattr(r.row.accuracy_latency.get(size), s[1], None) is not None for r in rows)]
        width = 0.8 / len(series)
        labeled: set[str] = set()
        floors: list[float] = []
        for k, (label, key, floor_key) in enumerate(series):
            for i, r in enumerate(rows):
                result = r.row.accuracy_latency.get(size)
                value = getattr(result, key, None)
                x = i - 0.4 + width * (k + 0.5)
                if value is None:
                    # An empty slot would read as "too fast to see"; say why it is empty.
                    figure = key[:-len("_graph_us")] if key.endswith("_graph_us") else None
                    why = ("no backward" if key.startswith("fwd_bwd") and not r.row.has_backward else
                           "not captured" if figure in ((result.graph_unavailable or {}) if result else {}) else None)
                    if why:
                        ax.text(x, 0.03, why, transform=ax.get_xaxis_transform(), ha="center",
                                va="bottom", fontsize=7, rotation=90, color="#555")
                    continue
                ax.bar(x, value, width, color=SERIES_COLOR[label], label=None if label in labeled else label)
                labeled.add(label)
                ax.text(x, value * 1.06, fmt.us(value), ha="center", va="bottom", fontsize=7, rotation=90)
                floor = getattr(result, floor_key, None)
                if floor is not None:
                    ax.hlines(floor, x - width / 2, x + width / 2, colors="black", linewidth=2,
                              label=None if "memory floor" in labeled else "memory floor")
                    labeled.add("memory floor")
                    floors.append(floor)
        _legend_outside(ax)
        heights = [p.get_height() for p in ax.patches if p.get_height() > 0]
        _decades(ax, heights + floors + [h * 4 for h in heights])  # x4: room for the labels above the bars
        ax.set_xticks(range(len(rows)), [r.label for r in rows], rotation=20, ha="right")
        ax.set_ylabel("latency (µs, log scale)")
        ax.set_title(f"R = {size} rows", fontsize=11)
        ax.grid(axis="y", which="both", alpha=0.3)
    timing = evidence.environment.timing
    clock = "wall-clock" if timing is not None and timing.timer == "wall_clock" else "CUDA-event"
    fig.suptitle(_title(evidence, f"latency (median {clock} time)"))
    return _save(fig, path)


def _decades(ax, values: list[float]) -> None:
    """Log axis over whole decades: always two labelled major ticks, no crowded minor labels."""
    ax.set_yscale("log")
    values = [v for v in values if v > 0 and math.isfinite(v)]
    if values:
        ax.set_ylim(10 ** math.floor(math.log10(min(values))), 10 ** math.ceil(math.log10(max(values))))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _legend_outside(ax) -> None:
    # Inside the axes the legend hides the first group's value labels.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0)


MARKERS = {"fwd": "o", "x": "s", "w": "^", "sh": "v", "sc": "D"}


def plot_accuracy(evidence: Evidence, path: PathLike) -> Path:
    """Relative error of the forward and each gradient, log scale, one panel per row count."""
    rows, sizes = _measured(evidence), sizes_of(evidence)
    if not rows or not sizes:
        return _empty(path, "accuracy")
    quantities = ["fwd"] + grads_of(evidence)
    fig = Figure(figsize=(max(8.0, 1.3 * len(rows) + 2), 3.6 * len(sizes)), layout="constrained")
    axes = fig.subplots(len(sizes), 1, squeeze=False)[:, 0]
    for ax, size in zip(axes, sizes):
        for k, q in enumerate(quantities):
            xs, ys = [], []
            for i, r in enumerate(rows):
                result = r.row.accuracy_latency.get(size)
                if result is None:
                    continue
                value = result.fwd_rel_err if q == "fwd" else (result.grad_rel_err or {}).get(q)
                # log scale: an exact zero has no position; it would only be dropped silently.
                if value is not None and value > 0 and math.isfinite(value):
                    xs.append(i + (k - (len(quantities) - 1) / 2) * 0.12)
                    ys.append(value)
            ax.scatter(xs, ys, marker=MARKERS.get(q, "P"), s=36, label=q if q == "fwd" else f"grad {q}",
                       zorder=3)
        _decades(ax, [v for c in ax.collections for v in c.get_offsets()[:, 1]])
        ax.set_xticks(range(len(rows)), [r.label for r in rows], rotation=20, ha="right")
        ax.set_ylabel("max|err| / max|ref| (log)")
        ax.set_title(f"R = {size} rows", fontsize=11)
        ax.grid(axis="y", which="both", alpha=0.3)
        _legend_outside(ax)
    fig.suptitle(_title(evidence, "relative error vs float64 reference"))
    return _save(fig, path)


def _cell_text(check: Optional[verdicts.Check], status: verdicts.Status) -> str:
    if status is verdicts.Status.FAIL and check is not None and check.short:
        return f"fail\n{check.short}"
    return status.value


def plot_verdicts(evidence: Evidence, path: PathLike) -> Path:
    """Implementation x check grid: green pass, red fail, grey n.a. or unavailable."""
    rows = _rows(evidence)
    if not rows:
        return _empty(path, "verdicts")
    columns = list(verdicts.grid_columns())
    fig = Figure(figsize=(2 + 1.55 * len(columns), 0.8 + 0.5 * len(rows)), layout="constrained")
    ax = fig.subplots()
    for i, r in enumerate(rows):
        if isinstance(r.row, UnavailableRow):
            cells = {c: (verdicts.Status.NA, "—") for c in columns}
            cells["batch_invariant"] = (verdicts.Status.NA, "unavailable")
        else:
            by_name = {c.name: c for c in verdicts.checks(r.row)}
            cells = {c: (s, _cell_text(by_name.get(c), s)) for c, s in verdicts.grid(r.row).items()}
        for j, column in enumerate(columns):
            status, text = cells[column]
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=STATUS_COLOR[status], edgecolor="white", linewidth=2))
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=8,
                    fontweight="bold" if column == "batch_invariant" else "normal")
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], columns, fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [r.label for r in rows], fontsize=9)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.suptitle(_title(evidence, "batch-invariance verdicts"), fontsize=11)
    return _save(fig, path)
