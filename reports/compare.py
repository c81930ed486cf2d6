"""Compare two evidence files of one op: what changed per row, and which changes are regressions.

A regression is one of:
- a verdict lost: `batch_invariant` or `params_repeatable` went from true to false;
- a row measured in the old file that is unavailable in the new one, or (unless allowed) absent from it; a
  row skipped by choice in the new file (a row a CPU runs only when named) or measured in neither is not;
- a relative error that grew by more than `Thresholds.error_factor`, or a gradient no longer produced;
- a latency slower than its measured noise allows (`allowed_slowdown`), on the same GPU model, by
  the same timing method and with the same L2 flush setting only, at the largest row count both files measured (smaller ones are shown,
  not judged: see LATENCY_NOISE).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from h3bench.harness.schema import Evidence, Row, RowResult, SizeResult, UnavailableMode, UnavailableRow
from h3bench.reports import fmt
from h3bench.harness.schema import size_key

# How much an error may grow before it is a regression: above a new build's few ULPs, far below an accuracy
# bug's order of magnitude (docs/decisions.md, "compare").
ERROR_GROWTH_FACTOR = 1.5

# Allowed relative slow-down where a file records no spreads (docs/decisions.md, "compare"): new/old >
# 1 + LATENCY_NOISE is a regression, judged at the largest size both files measured.
LATENCY_NOISE = 0.10

# With recorded spreads (p10/p90 per figure) the allowed slow-down is the measured noise, never under this.
MIN_LATENCY_NOISE = 0.03

# Latency is judged only from CUDA-event timings with at least this many samples a figure in both files: a
# quick CPU run's one host-clock sample says nothing (docs/decisions.md, "compare").
MIN_JUDGED_SAMPLES = 20

LATENCY_KEYS = ("fwd_us", "fwd_bwd_us", "fwd_bwd_net_us", "fwd_stream_us", "fwd_bwd_stream_us",
                "fwd_bwd_net_stream_us", "fwd_graph_us", "fwd_bwd_graph_us", "fwd_bwd_net_graph_us")
# What the latencies of files without a timing record mean (docs/probes.md: the RFC's script
# synchronizes after each sample; h3bench files from before the timing record hold back-to-back samples
# under fwd_us).
RFC_SCRIPT_METHOD = "synchronized (the RFC script, docs/probes.md)"
OLD_H3BENCH_METHOD = "back-to-back (h3bench before its timing record)"


@dataclass(frozen=True)
class Thresholds:
    error_factor: float = ERROR_GROWTH_FACTOR
    latency_noise: float = LATENCY_NOISE
    # A partial run (a subset of rows) compared with a full baseline would flag every absent row.
    allow_missing_rows: bool = False


@dataclass(frozen=True)
class Quantity:
    """One number measured in both files: `name` is e.g. "4097 fwd_us" or "32768 grad sh"."""

    name: str
    old: float
    new: float
    regression: bool
    allowed: Optional[float] = None  # latency only: the relative slow-down the measured noise allows

    @property
    def ratio(self) -> float:
        if self.old == 0:
            return 1.0 if self.new == 0 else math.inf
        return self.new / self.old


@dataclass(frozen=True)
class VerdictFlip:
    verdict: str  # "batch_invariant" | "params_repeatable"
    old: Optional[bool]
    new: Optional[bool]
    regression: bool


@dataclass(frozen=True)
class Regression:
    mode: str
    row: str
    kind: str  # "verdict" | "unavailable" | "missing" | "error" | "lost_gradient" | "latency"
    message: str


@dataclass
class RowChange:
    mode: str
    row: str
    # "compared" | "new" | "missing" | "not_run" | "skipped" | "became_unavailable" | "became_available" |
    # "unavailable"
    status: str
    flips: list[VerdictFlip] = field(default_factory=list)
    latency: list[Quantity] = field(default_factory=list)
    errors: list[Quantity] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    old_gpu: Optional[str]
    new_gpu: Optional[str]
    thresholds: Thresholds
    latency_compared: bool
    rows: list[RowChange] = field(default_factory=list)
    regressions: list[Regression] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def has_regression(self) -> bool:
        return bool(self.regressions)

    @property
    def new_rows(self) -> list[RowChange]:
        return [r for r in self.rows if r.status == "new"]

    @property
    def lost_rows(self) -> list[RowChange]:
        return [r for r in self.rows if r.status in ("missing", "became_unavailable")]


def _error_quantities(size: str, old: SizeResult, new: SizeResult, factor: float,
                      change: RowChange) -> list[Quantity]:
    pairs = [("fwd", old.fwd_rel_err, new.fwd_rel_err)]
    old_grads, new_grads = old.grad_rel_err or {}, new.grad_rel_err or {}
    pairs += [(f"grad {g}", v, new_grads.get(g)) for g, v in old_grads.items()]
    out = []
    for label, o, n in pairs:
        if n is None:
            change.notes.append(f"{size} {label}: no longer produced")
            continue
        grew = n > o * factor if o > 0 else n > 0
        out.append(Quantity(f"{size} {label}", o, n, grew or math.isnan(n)))
    for g in new_grads.keys() - old_grads.keys():
        change.notes.append(f"{size} grad {g}: newly produced")
    return out


def _best_timing(result: SizeResult, key: str) -> Optional[float]:
    """The better of a latency and its repeat: host hiccups only ever make a timing slower."""
    values = [v for v in (getattr(result, key), getattr(result, f"{key}_repeat", None)) if v is not None]
    return min(values) if values else None


def measured_noise(result: SizeResult, key: str) -> Optional[float]:
    """How far this file's own samples say the figure moves: the relative p10-p90 width of its timings
    and the distance between its two timings; None without recorded spreads."""
    spreads = result.spread or {}
    found = [spreads[k] for k in (key, f"{key}_repeat") if k in spreads]
    if not found:
        return None
    widths = [(s.p90 - s.p10) / s.p50 for s in found if s.p50 > 0]
    first, second = getattr(result, key), getattr(result, f"{key}_repeat", None)
    if first and second:
        widths.append(abs(first - second) / min(first, second))
    return max(widths) if widths else None


def allowed_slowdown(old: SizeResult, new: SizeResult, key: str, fallback: float) -> float:
    noises = [measured_noise(old, key), measured_noise(new, key)]
    if any(n is None for n in noises):
        return fallback
    return max(MIN_LATENCY_NOISE, *noises)


def _latency_quantities(size: str, old: SizeResult, new: SizeResult, noise: float,
                        judged: bool) -> list[Quantity]:
    out = []
    for key in LATENCY_KEYS:
        o, n = _best_timing(old, key), _best_timing(new, key)
        if o is None or n is None:
            continue
        allowed = allowed_slowdown(old, new, key, noise)
        out.append(Quantity(f"{size} {key}", o, n, judged and o > 0 and n / o > 1 + allowed, allowed))
    return out


def _compare_rows(mode: str, name: str, old: RowResult, new: RowResult, thresholds: Thresholds,
                  judge_latency: bool) -> RowChange:
    change = RowChange(mode, name, "compared")
    ob, nb = old.batch_invariance, new.batch_invariance
    for verdict, o, n in (("batch_invariant", ob.batch_invariant, nb.batch_invariant),
                          ("params_repeatable", ob.params_repeatable, nb.params_repeatable)):
        if o != n:
            change.flips.append(VerdictFlip(verdict, o, n, regression=o is True and n is False))
    common = [size for size in old.accuracy_latency if size in new.accuracy_latency]
    judged_size = max(common, key=size_key) if common else None
    for size in sorted(old.accuracy_latency, key=size_key):
        o = old.accuracy_latency[size]
        n = new.accuracy_latency.get(size)
        if n is None:
            change.notes.append(f"size {size} not measured in the new file")
            continue
        change.errors += _error_quantities(size, o, n, thresholds.error_factor, change)
        change.latency += _latency_quantities(size, o, n, thresholds.latency_noise,
                                              judge_latency and size == judged_size)
    for size in new.accuracy_latency.keys() - old.accuracy_latency.keys():
        change.notes.append(f"size {size} only in the new file")
    return change


def _regressions(change: RowChange, thresholds: Thresholds) -> list[Regression]:
    out = []
    where = (change.mode, change.row)
    if change.status == "became_unavailable":
        out.append(Regression(*where, "unavailable", f"{change.row}: measured before, now unavailable "
                                                     f"({'; '.join(change.notes)})"))
    if change.status == "missing" and not thresholds.allow_missing_rows:
        out.append(Regression(*where, "missing", f"{change.row}: in the old file, absent from the new one"))
    for flip in change.flips:
        if flip.regression:
            out.append(Regression(*where, "verdict", f"{change.row}: {flip.verdict} {flip.old} -> {flip.new}"))
    for q in change.errors:
        if q.regression:
            out.append(Regression(*where, "error", f"{change.row} {q.name} error {fmt.err(q.old)} -> "
                                                   f"{fmt.err(q.new)} ({fmt.ratio(q.ratio)}, limit "
                                                   f"{thresholds.error_factor:g}x)"))
    for note in change.notes:
        if note.endswith("no longer produced"):
            out.append(Regression(*where, "lost_gradient", f"{change.row} {note}"))
    for q in change.latency:
        if q.regression:
            out.append(Regression(*where, "latency", f"{change.row} {q.name} {fmt.us(q.old)} -> "
                                                     f"{fmt.us(q.new)} µs ({fmt.ratio(q.ratio)}, limit "
                                                     f"{1 + q.allowed:.2f}x from the measured noise)"))
    return out


def _row_change(mode: str, name: str, old: Optional[Row], new: Optional[Row], thresholds: Thresholds,
                judge_latency: bool) -> RowChange:
    if old is None:
        return RowChange(mode, name, "new")
    if new is None:  # only a row the old file measured is lost; one that never ran there is not
        return (RowChange(mode, name, "missing") if isinstance(old, RowResult) else
                RowChange(mode, name, "not_run", notes=[f"absent from the new file; old: {old.unavailable}"]))
    if isinstance(old, RowResult) and isinstance(new, RowResult):
        return _compare_rows(mode, name, old, new, thresholds, judge_latency)
    if isinstance(old, RowResult):
        assert isinstance(new, UnavailableRow)
        return RowChange(mode, name, "skipped" if new.skipped else "became_unavailable", notes=[new.unavailable])
    if isinstance(new, RowResult):
        return RowChange(mode, name, "became_available", notes=[f"was: {old.unavailable}"])
    return RowChange(mode, name, "unavailable", notes=[new.unavailable])


def timing_method(evidence: Evidence) -> str:
    """How the file's `*_us` latencies were sampled: its timing record, or what its provenance says."""
    record = evidence.environment.timing
    if record is not None:
        return f"{record.sample} ({record.timer})"
    return RFC_SCRIPT_METHOD if evidence.h3bench_commit is None else OLD_H3BENCH_METHOD


def flush_state(evidence: Evidence) -> str:
    """Whether the file's samples started with a flushed L2; a file without the key flushed nothing (the
    prior art's script does not)."""
    record = evidence.environment.timing
    if record is None or not record.flush_l2:
        return "no L2 flush"
    return f"L2 flushed before each sample ({record.flush_bytes or 0} bytes)"


def _unjudgeable_timing(evidence: Evidence) -> Optional[str]:
    """Why the file's latencies cannot be judged (host-clock timing, too few samples), or None."""
    record = evidence.environment.timing
    if record is None:  # the RFC's files: its script's CUDA events, 100 samples
        return None
    if record.timer != "cuda_events":
        return f"latencies are {record.timer.replace('_', '-')} timings"
    if record.reps < MIN_JUDGED_SAMPLES:
        return f"latencies have {record.reps} sample(s) per figure (fewer than {MIN_JUDGED_SAMPLES})"
    return None


def compare(old: Evidence, new: Evidence, thresholds: Thresholds = Thresholds()) -> Comparison:
    if old.op != new.op:  # rows, sizes and errors of two operators have nothing to say about each other
        raise ValueError(f"cannot compare: op differs ({old.op!r} vs {new.op!r})")
    old_gpu, new_gpu = old.environment.gpu, new.environment.gpu
    # Latency is a property of the GPU model: a B200 baseline says nothing about an H200's speed; and
    # latencies sampled by different methods are different quantities.
    same_gpu = old_gpu == new_gpu
    same_method = timing_method(old) == timing_method(new)
    # a cold L2 at every sample is another quantity than a warm one, whichever is faster
    same_flush = flush_state(old) == flush_state(new)
    unjudged = [f"the {label} file's {why}" for label, evidence in (("old", old), ("new", new))
                for why in [_unjudgeable_timing(evidence)] if why]
    result = Comparison(old_gpu, new_gpu, thresholds,
                        latency_compared=same_gpu and same_method and same_flush and not unjudged)
    if not same_gpu:
        result.notes.append(f"different GPUs ({old_gpu} vs {new_gpu}): latency ratios shown, not judged")
    if not same_method:
        result.notes.append(f"latencies sampled by different methods ({timing_method(old)} vs "
                            f"{timing_method(new)}): ratios shown, not judged")
    if not same_flush:
        result.notes.append(f"L2 flush settings differ ({flush_state(old)} vs {flush_state(new)}): latency "
                            "ratios shown, not judged")
    for why in unjudged:
        result.notes.append(f"{why}: latency ratios shown, not judged")
    if old.quick != new.quick:
        result.notes.append(f"quick differs (old {old.quick}, new {new.quick}): counts and timings "
                            "come from different plans")
    for label, a, b in (("torch", old.environment.torch, new.environment.torch),
                        ("CUDA", old.environment.cuda, new.environment.cuda)):
        if a != b:
            result.notes.append(f"{label} {a} -> {b}")
    for mode in list(old.results) + [m for m in new.results if m not in old.results]:
        for label, evidence in (("old", old), ("new", new)):
            found = evidence.results.get(mode)
            if isinstance(found, UnavailableMode):
                result.notes.append(f"mode {mode} unavailable in the {label} file: {found.unavailable}")
        old_rows, new_rows = old.rows(mode), new.rows(mode)
        for name in list(old_rows) + [n for n in new_rows if n not in old_rows]:
            change = _row_change(mode, name, old_rows.get(name), new_rows.get(name), thresholds,
                                 result.latency_compared)
            result.rows.append(change)
            result.regressions += _regressions(change, thresholds)
    return result


def render_comparison(comparison: Comparison) -> str:
    """Markdown: regressions first, then every row's verdict flips, ratios and notes."""
    t = comparison.thresholds
    out = ["# h3bench comparison", "",
           f"- GPUs: {comparison.old_gpu} (old) vs {comparison.new_gpu} (new)",
           f"- thresholds: error growth > {t.error_factor:g}x; latency slower than its measured noise allows "
           f"(at least {MIN_LATENCY_NOISE:.0%}; {t.latency_noise:.0%} where a file has no recorded spreads)"
           + ("" if comparison.latency_compared else " (latency not judged: see the notes)")]
    out += [f"- note: {n}" for n in comparison.notes]
    out += ["", f"## Regressions ({len(comparison.regressions)})", ""]
    out += [f"- **{r.kind}** [{r.mode}] {r.message}" for r in comparison.regressions] or ["none"]
    out += ["", "## Rows", "", "| mode | row | status | verdict flips | latency new/old | error new/old | notes |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in comparison.rows:
        flips = ", ".join(f"{f.verdict} {fmt.tri(f.old)} -> {fmt.tri(f.new)}" for f in c.flips)
        lat = ", ".join(f"{q.name} {fmt.ratio(q.ratio)}" for q in c.latency)
        err = ", ".join(f"{q.name} {fmt.ratio(q.ratio)}" for q in c.errors)
        notes = "; ".join(c.notes).replace("|", "\\|")
        out.append(f"| {c.mode} | {c.row} | {c.status} | {flips} | {lat} | {err} | {notes} |")
    return "\n".join(out) + "\n"
