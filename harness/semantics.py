"""What `h3bench validate` checks beyond the contract's keys and types: that a file means what it says.

- the op is one h3bench knows, and some mode has rows;
- every figure is a finite, non-negative number (errors, latencies, floors, their fractions and spreads);
- counts fit their totals (differing rows <= rows, first failures <= failures <= comparisons);
- each verdict follows from its counts (batch_invariant is true exactly when nothing differed and the
  parameter gradients did not fail to repeat; each flag of a probe beyond the RFC's likewise);
- where the file records its floor model (harness/floors.py), no floor fraction is above 1;
- where the file records its plan (`config`), the totals are the plan's (rows per case, sub-batches,
  sweep comparisons);
- the negative control (`control`), where measured, holds to the same rules, compares the op's row
  gradients, and is `flagged` exactly when every check counted a difference (harness/control.py).
Each problem is one line naming its JSON path."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

from h3bench.harness.probes import registry
from h3bench.harness.probes.batch_invariance import invariant, sub_batches_total, sweep_total
from h3bench.harness.schema import BatchInvariance, ControlResult, Evidence, RowResult, SizeResult, UnavailableMode


def numbers(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) for every number (bools aside) in a record: dataclass fields and dict keys as
    `path.name`, list items as `path[i]` (a record's own fields have no leading dot when `path` is "")."""
    if dataclasses.is_dataclass(obj):
        items = ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    elif isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from numbers(value, f"{path}[{i}]")
        return
    else:
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            yield path, obj
        return
    for key, value in items:
        yield from numbers(value, f"{path}.{key}" if path else str(key))


def _figure_problems(row: RowResult, where: str) -> list[str]:
    found = []
    for size, result in row.accuracy_latency.items():
        for path, value in numbers(result, f"{where}.accuracy_latency.{size}"):
            if not math.isfinite(value) or value < 0:
                found.append(f"{path}: {value!r} is not a finite non-negative number")
    if row.wall_s is not None and not (math.isfinite(row.wall_s) and row.wall_s >= 0):
        found.append(f"{where}.wall_s: {row.wall_s!r} is not a finite non-negative number")
    return found


def _floor_problems(row: RowResult, where: str) -> list[str]:
    # The floor model lowers each floor to the fastest median it bounds, so a fraction above 1 is a floor
    # that is not one.
    return [f"{where}.accuracy_latency.{size}.{name}: {value!r} is above 1: the floor is above a measured time"
            for size, result in row.accuracy_latency.items() for name, value in floor_fractions(result)
            if value > 1]


def floor_fractions(result: SizeResult) -> list[tuple[str, float]]:
    """(key, value) of every floor fraction a size's record holds."""
    return [(f.name, getattr(result, f.name)) for f in dataclasses.fields(result)
            if f.name.endswith("_floor_fraction") and getattr(result, f.name) is not None]


def _count_problems(bi: BatchInvariance, where: str, row_grads: int = 1) -> list[str]:
    """`row_grads`: how many per-row gradients the op has; their counts are summed into `rowgrad_differ`."""
    found = []
    per = max(row_grads, 1)
    for size, case in bi.all_rows.items():
        if not (0 <= case.fwd_differ <= case.rows and 0 <= case.rowgrad_differ <= case.rows * per):
            found.append(f"{where}.all_rows.{size}: differing rows ({case.fwd_differ}, {case.rowgrad_differ}) "
                         f"not within 0..{case.rows}" + (f" (0..{case.rows * per} for the {per} row gradients)"
                                                         if per > 1 else ""))
    subs = bi.full_vs_sub_batches
    if not (0 <= subs.fwd_differ <= subs.sub_batches and 0 <= subs.rowgrad_differ <= subs.sub_batches * per):
        found.append(f"{where}.full_vs_sub_batches: differing sub-batches ({subs.fwd_differ}, {subs.rowgrad_differ}) "
                     f"not within 0..{subs.sub_batches}" + (f" (0..{subs.sub_batches * per} for the {per} row "
                                                            f"gradients)" if per > 1 else ""))
    sweep = bi.batch_size_sweep
    if not 0 <= sweep.differ <= sweep.comparisons:
        found.append(f"{where}.batch_size_sweep.differ: {sweep.differ} not within 0..{sweep.comparisons}")
    if len(sweep.first_failures) > sweep.differ:
        found.append(f"{where}.batch_size_sweep.first_failures: {len(sweep.first_failures)} listed, "
                     f"{sweep.differ} counted")
    expected = invariant(bi.all_rows, bi.params_repeatable, subs, sweep)
    if bi.batch_invariant != expected:
        found.append(f"{where}.batch_invariant: {bi.batch_invariant} but the counts and params_repeatable="
                     f"{bi.params_repeatable} say {expected}")
    return found + _beyond_rfc_problems(bi, where)


def _beyond_rfc_problems(bi: BatchInvariance, where: str) -> list[str]:
    """The probes beyond the RFC's (harness/probes/registry.py): their counts within their totals, then each
    flag against what its counts say."""
    found, checked = [], []
    for spec in registry.beyond_rfc():
        record = bi.beyond_rfc.get(spec.name)
        if record is not None:
            found += spec.problems(record, f"{where}.{spec.name}")
            checked.append((spec.name, record.invariant, spec.invariant(record)))
    for name, recorded, expected in checked:
        if recorded != expected:
            found.append(f"{where}.{name}.invariant: {recorded} but its counts say {expected}")
    return found


def _plan_totals(config: dict) -> dict[str, Any]:
    """The totals the recorded plan implies, or {} when the file records no usable plan."""
    from h3bench.harness.config import AllRowsPlan, SubBatchPlan, SweepPlan

    try:
        all_rows = AllRowsPlan(**config["all_rows"])
        subs = SubBatchPlan(**config["full_vs_sub"])
        sweep = SweepPlan(**config["sweep"])
        return {"all_rows": {str(n): len(all_rows.seeds) * n for n in all_rows.batch_sizes},
                "sub_batches": sub_batches_total(subs), "full_batch": subs.full_batch,
                "comparisons": sweep_total(sweep)}
    except (KeyError, TypeError, ValueError):
        return {}


def _plan_problems(bi: BatchInvariance, totals: dict, where: str) -> list[str]:
    if not totals:
        return []
    found = []
    rows = {size: case.rows for size, case in bi.all_rows.items()}
    if rows != totals["all_rows"]:
        found.append(f"{where}.all_rows: rows {rows}, the recorded plan gives {totals['all_rows']}")
    subs = bi.full_vs_sub_batches
    if (subs.sub_batches, subs.full_batch) != (totals["sub_batches"], totals["full_batch"]):
        found.append(f"{where}.full_vs_sub_batches: {subs.sub_batches} sub-batches of a {subs.full_batch}-row "
                     f"batch, the recorded plan gives {totals['sub_batches']} of {totals['full_batch']}")
    if bi.batch_size_sweep.comparisons != totals["comparisons"]:
        found.append(f"{where}.batch_size_sweep.comparisons: {bi.batch_size_sweep.comparisons}, the recorded "
                     f"plan gives {totals['comparisons']}")
    return found


def problems(evidence: Evidence) -> list[str]:
    """Every way `evidence` contradicts itself or h3bench's ops; empty when it means what it says."""
    from h3bench.harness.ops import OP_MODULES, known

    found = []
    if not known(evidence.op):
        found.append(f"$.op: {evidence.op!r} is not an op h3bench knows ({', '.join(OP_MODULES)}; a user op's "
                     f"file validates with --op PATH.py:ATTR)")
    measured = [rows for rows in evidence.results.values() if not isinstance(rows, UnavailableMode) and rows]
    if not measured:
        found.append("$.results: no mode has a row")
    if evidence.wall_s is not None and not (math.isfinite(evidence.wall_s) and evidence.wall_s >= 0):
        found.append(f"$.wall_s: {evidence.wall_s!r} is not a finite non-negative number")
    totals = _plan_totals(evidence.config) if isinstance(evidence.config, dict) else {}
    row_grads = _row_grads(evidence.op)
    for mode, rows in evidence.measured_modes().items():
        for name, row in rows.items():
            if isinstance(row, RowResult):
                where = f"$.results.{mode}.{name}"
                found += _figure_problems(row, where)
                if evidence.environment.floor_model:
                    found += _floor_problems(row, where)
                found += _count_problems(row.batch_invariance, f"{where}.batch_invariance", len(row_grads or ()))
                found += _plan_problems(row.batch_invariance, totals, f"{where}.batch_invariance")
    if isinstance(evidence.control, ControlResult):
        found += _control_problems(evidence.control, totals, row_grads)
    return found


def _row_grads(op: str) -> "tuple[str, ...] | None":
    """The op's per-row gradients; None for an op h3bench does not know."""
    from h3bench.harness.ops import get_op, known

    return get_op(op).row_grads if known(op) else None


def _control_problems(record: ControlResult, totals: dict, row_grads: "tuple[str, ...] | None") -> list[str]:
    from h3bench.harness.control import checks, flagged

    where = "$.control"
    found = _count_problems(record.batch_invariance, f"{where}.batch_invariance", len(record.row_grads))
    found += _plan_problems(record.batch_invariance, totals, f"{where}.batch_invariance")
    if row_grads is not None and sorted(record.row_grads) != sorted(row_grads):
        found.append(f"{where}.row_grads: {record.row_grads}, the op's row gradients are {list(row_grads)}")
    if record.wall_s is not None and not (math.isfinite(record.wall_s) and record.wall_s >= 0):
        found.append(f"{where}.wall_s: {record.wall_s!r} is not a finite non-negative number")
    expected = flagged(record)
    if record.flagged != expected:
        counts = ", ".join(f"{name} {differ}/{total}" for name, differ, total in checks(record))
        found.append(f"{where}.flagged: {record.flagged} but the counts say {expected} ({counts})")
    return found


# The norm_modulate sweep (tools/sweep_norm_modulate.py) writes its own format: timings over widths, table
# sizes and dtypes, not an evidence file. It is recognised by these keys and checked for meaning alike.
SWEEP_KEYS = ("hidden_sweep", "table_rows_sweep", "dtype_matrix")


def is_sweep(data: Any) -> bool:
    return isinstance(data, dict) and all(key in data for key in SWEEP_KEYS)


def sweep_problems(data: dict) -> list[str]:
    """A sweep file's problems: it names its GPU, measured a bandwidth, has timed points, and every number
    in it is finite and non-negative."""
    found = []
    if not isinstance(data.get("gpu"), str) or not data["gpu"]:
        found.append("$.gpu: the sweep names no GPU")
    if not (isinstance(data.get("bandwidth_gbps"), (int, float)) and data["bandwidth_gbps"] > 0):
        found.append(f"$.bandwidth_gbps: {data.get('bandwidth_gbps')!r} is not a measured bandwidth")
    if not data["hidden_sweep"] and not data["table_rows_sweep"]:
        found.append("$: no timed point (hidden_sweep and table_rows_sweep are empty)")
    found += [f"{path}: {value!r} is not a finite non-negative number"
              for path, value in numbers(data, "$") if not math.isfinite(value) or value < 0]
    return found
