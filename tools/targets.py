"""The performance targets for our `h3bench_triton` rows, checked against evidence files: one line per target,
what was measured and whether it is met.

    python -m tools.targets reports/evidence/*_h200.json [--modes reports/evidence/*_modes_h200.json]

Read from the files only (nothing is re-measured): floor fractions are the back-to-back (`stream`)
figures' (the README's convention), "fastest" compares net forward+backward (forward for forward-only
ops) in both timings against every other measured row of the same file, latency ratios use the
per-sample synchronized figure (the RFC's method), errors are max|err| / max|ref| against float64 at
every accuracy size. An op without our row, or a size the file lacks, gives "not measured".
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from h3bench.harness import schema
from h3bench.harness.schema import RowResult

OURS = "h3bench_triton"
ERROR_FACTOR = 1.5        # every output and gradient within 1.5x of the best row's error
MEMORY_OPS = {            # op: (forward floor fraction, net fwd+bwd floor fraction) at the largest size
    "adaln_row_gather": (0.85, 0.70),
    "gate_residual": (0.85, 0.75),
    "final_adaln_out": (None, 0.70),
}
GEMM_OPS = ("timestep_mlp", "adaln_projection")
GEMM_RATIO = 1.3          # net fwd+bwd at the largest T against plain F.linear (cuBLAS)
GEMM_SMALL_T = 8          # at T <= 8 the forward streams the weights ...
GEMM_STREAM = 0.70        # ... at >= 70% of its floor (its bytes at the read and write bandwidths)
SINUSOID_ERROR = 1e-7


@dataclass(frozen=True)
class Check:
    op: str
    target: str
    measured: str
    met: Optional[bool]   # None: not measured


def measured_rows(evidence: schema.Evidence, mode: str = "plain") -> dict[str, RowResult]:
    return {name: row for name, row in evidence.rows(mode).items() if isinstance(row, RowResult)}


def _largest(evidence: schema.Evidence) -> str:
    return max(schema.sizes_of(evidence), key=int)


def _net(row: RowResult, size: str, stream: bool) -> Optional[float]:
    r = row.accuracy_latency.get(size)
    if r is None:
        return None
    if row.has_backward:
        return r.fwd_bwd_net_stream_us if stream else r.fwd_bwd_net_us
    return r.fwd_stream_us if stream else r.fwd_us


def same_reference(rows: dict[str, RowResult]) -> dict[str, RowResult]:
    """The rows measured against the same float64 reference as ours: a row of part of the op (norm_modulate's
    norm alone, `reference` "rms_norm") neither computes nor costs what ours does."""
    return {name: row for name, row in rows.items() if row.reference == rows[OURS].reference}


def fastest(op: str, rows: dict[str, RowResult], size: str) -> Check:
    rows = same_reference(rows)
    ours = rows[OURS]
    worse = []
    for stream in (False, True):
        mine = _net(ours, size, stream)
        for name, row in rows.items():
            theirs = _net(row, size, stream)
            if name != OURS and theirs is not None and mine is not None and theirs <= mine:
                worse.append(f"{name} {theirs:.1f} <= {mine:.1f} ({'stream' if stream else 'sync'})")
    what = "net fwd+bwd" if ours.has_backward else "forward"
    return Check(op, f"fastest row ({what}, S = {size}, both timings)",
                 "; ".join(worse) or f"ours {_net(ours, size, False):.1f} / {_net(ours, size, True):.1f} us",
                 not worse)


def errors(op: str, rows: dict[str, RowResult]) -> Check:
    """Worst ratio of our error to the best row's, over every output, gradient and accuracy size, among the
    rows of our reference (`same_reference`)."""
    rows = same_reference(rows)
    worst, where = 0.0, ""
    for size, ours in rows[OURS].accuracy_latency.items():
        names = ["fwd"] + list(ours.grad_rel_err or {})
        for name in names:
            def err(row: RowResult) -> Optional[float]:
                r = row.accuracy_latency.get(size)
                if r is None:
                    return None
                return r.fwd_rel_err if name == "fwd" else (r.grad_rel_err or {}).get(name)
            found = [e for e in (err(r) for r in rows.values()) if e is not None]
            mine, best = err(rows[OURS]), min(found)
            ratio = (mine / best) if best > 0 else (1.0 if mine == 0 else float("inf"))
            if ratio > worst:
                worst, where = ratio, f"{name} at {size} ({mine:.2e} against {best:.2e})"
    return Check(op, f"every error within {ERROR_FACTOR}x of the best row's", f"worst {worst:.2f}x: {where}",
                 worst <= ERROR_FACTOR)


def invariance(op: str, ours: RowResult) -> list[Check]:
    bi = ours.batch_invariance
    out = [Check(op, "batch-invariant (every probe count 0)", "invariant" if bi.batch_invariant else "NOT invariant",
                 bool(bi.batch_invariant))]
    if bi.params_repeatable is not None:
        out.append(Check(op, "parameter gradients repeat bitwise", str(bi.params_repeatable), bool(bi.params_repeatable)))
    return out


def memory_op(op: str, rows: dict[str, RowResult], size: str) -> list[Check]:
    fwd_min, net_min = MEMORY_OPS[op]
    r = rows[OURS].accuracy_latency[size]
    out = []
    if fwd_min is not None:
        out.append(Check(op, f"forward >= {fwd_min:.0%} of the floor (S = {size}, stream)",
                         f"{r.fwd_stream_floor_fraction:.1%} ({r.fwd_stream_us:.1f} us)",
                         r.fwd_stream_floor_fraction >= fwd_min))
    out.append(Check(op, f"net fwd+bwd >= {net_min:.0%} of the floor (S = {size}, stream)",
                     f"{r.fwd_bwd_net_stream_floor_fraction:.1%} ({r.fwd_bwd_net_stream_us:.1f} us)",
                     r.fwd_bwd_net_stream_floor_fraction >= net_min))
    return out + [fastest(op, rows, size)]


def sinusoid(op: str, rows: dict[str, RowResult]) -> list[Check]:
    ours = rows[OURS]
    worst = max(r.fwd_rel_err for r in ours.accuracy_latency.values())
    out = [Check(op, f"error <= {SINUSOID_ERROR:g} at every T", f"max {worst:.2e}", worst <= SINUSOID_ERROR)]
    sglang = rows.get("sglang")
    target = "per-sample latency no worse than SGLang's at every T (both timings of it)"
    if sglang is None:
        return out + [Check(op, target, "SGLang not measured", None)]
    slower = []
    for s, r in ours.accuracy_latency.items():
        theirs = sglang.accuracy_latency.get(s)
        if theirs is None:
            continue
        # each figure and its repeat (two timings of the same thing) must be no worse
        for name in ("fwd_us", "fwd_us_repeat"):
            mine, other = getattr(r, name, None), getattr(theirs, name, None)
            if mine is not None and other is not None and mine > other:
                slower.append(f"T={s}{' (repeat)' if name.endswith('repeat') else ''}: {mine:.1f} > {other:.1f}")
    return out + [Check(op, target, "; ".join(slower) or "never slower", not slower)]


def gemm(op: str, rows: dict[str, RowResult], size: str, modes: Optional[schema.Evidence]) -> list[Check]:
    ours, out = rows[OURS], []
    plain = rows.get("diffusers[plain]") or rows.get("diffusers")
    if plain is None:
        out.append(Check(op, f"net fwd+bwd <= {GEMM_RATIO}x plain F.linear (T = {size})", "no plain row", None))
    else:
        ratio = ours.accuracy_latency[size].fwd_bwd_net_us / plain.accuracy_latency[size].fwd_bwd_net_us
        out.append(Check(op, f"net fwd+bwd <= {GEMM_RATIO}x plain F.linear (T = {size}, sync)",
                         f"{ratio:.2f}x ({ours.accuracy_latency[size].fwd_bwd_net_us:.1f} against "
                         f"{plain.accuracy_latency[size].fwd_bwd_net_us:.1f} us)", ratio <= GEMM_RATIO))
    small = sorted((s for s in ours.accuracy_latency if int(s) <= GEMM_SMALL_T), key=int)
    fracs = {s: ours.accuracy_latency[s].fwd_stream_floor_fraction for s in small}
    out.append(Check(op, f"forward streams W at >= {GEMM_STREAM:.0%} of its floor at T <= {GEMM_SMALL_T} (stream)",
                     ", ".join(f"T={s} {f:.0%}" for s, f in fracs.items()) or "no such T",
                     all(f >= GEMM_STREAM for f in fracs.values()) if fracs else None))
    if modes is None:
        out.append(Check(op, "faster than every batch-invariant mode's row", "no modes file given", None))
        return out
    mine = ours.accuracy_latency[size].fwd_bwd_net_us
    faster = []
    for mode in modes.results:
        for name, row in measured_rows(modes, mode).items():
            if row.batch_invariance.batch_invariant and size in row.accuracy_latency:
                theirs = row.accuracy_latency[size].fwd_bwd_net_us
                if theirs <= mine:
                    faster.append(f"{name} {theirs:.1f} <= {mine:.1f}")
    out.append(Check(op, f"faster than every batch-invariant mode's row (T = {size}, net fwd+bwd, sync)",
                     "; ".join(faster) or "faster than all", not faster))
    return out


def checks(evidence: schema.Evidence, modes: Optional[schema.Evidence] = None) -> list[Check]:
    op, rows = evidence.op, measured_rows(evidence)
    if OURS not in rows:
        return [Check(op, "our row measured", "no measured h3bench_triton row", None)]
    size = _largest(evidence)
    out = invariance(op, rows[OURS])
    if op in MEMORY_OPS:
        out += memory_op(op, rows, size)
    elif op == "timestep_sinusoid":
        out += sinusoid(op, rows)
    elif op in GEMM_OPS:
        out += gemm(op, rows, size, modes)
    return out + [errors(op, rows)]


def table(found: Iterable[Check]) -> str:
    mark = {True: "met", False: "MISSED", None: "not measured"}
    lines = ["| op | target | measured | |", "| --- | --- | --- | --- |"]
    lines += [f"| {c.op} | {c.target} | {c.measured} | {mark[c.met]} |" for c in found]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> list[Check]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="evidence files, one per op (mode plain)")
    parser.add_argument("--modes", nargs="*", type=Path, default=[], help="the GEMM ops' modes files")
    args = parser.parse_args(argv)
    modes = {e.op: e for e in map(schema.load, args.modes)}
    found = []
    for path in args.files:
        evidence = schema.load(path)
        found += checks(evidence, modes.get(evidence.op))
    print(table(found))
    return found


if __name__ == "__main__":
    main()
