"""`h3bench run --require-invariant ROW[,ROW]|all`: the RFC's reuse rule as an exit code. A selected row
fails when it is not batch-invariant, when its parameter gradients do not repeat bitwise, or when it is
unavailable (a mode that is unavailable as a whole fails every selected row of it), or when one of h3bench's
probes beyond the RFC's (harness/probes/registry.py) found a difference; each failure is one line naming the op,
row, mode and the counts that failed.

The gate judges exactly the rows the user named: a row is matched by its name, or, in a mode that tags its
rows (`torch[vllm]`: Op.mode_tagged_rows), by that name with its mode's tag; a named row that no file holds
is a failure, never a silent pass; and the verdict lists every row it judged."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence, Union

from h3bench.harness.probes import registry
from h3bench.harness.probes.difference_text import describe_param
from h3bench.harness.probes.wording import failure_line, first_at
from h3bench.harness.schema import BatchInvariance, Evidence, RowResult, UnavailableMode, UnavailableRow

ALL = "all"
Selection = Union[str, frozenset]


def parse_selection(text: str) -> Selection:
    """`all`, or a set of row names; ValueError on an empty list."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--require-invariant {text!r}: name rows (ROW[,ROW]) or {ALL}")
    return ALL if ALL in names else frozenset(names)


def unknown_rows(selection: Selection, rows: Iterable[str]) -> list[str]:
    """The selected names no row of the run has (always none for `all`)."""
    return [] if selection == ALL else sorted(set(selection) - set(rows))


def what_failed(bi: BatchInvariance, located: bool = True) -> list[str]:
    """Each failed check with its counts (and, when `located`, where and how far the first difference is)."""
    found = []
    for size, case in sorted(bi.all_rows.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
        if case.fwd_differ or case.rowgrad_differ:
            found.append(failure_line(f"all_rows {size}", case.fwd_differ, case.rowgrad_differ, case.rows,
                                      case.first_difference, located))
    subs = bi.full_vs_sub_batches
    if subs.fwd_differ or subs.rowgrad_differ:
        found.append(f"full_vs_sub: fwd {subs.fwd_differ}, rowgrad {subs.rowgrad_differ} of {subs.sub_batches} "
                     f"sub-batches{first_at(subs.first_difference, located)}")
    sweep = bi.batch_size_sweep
    if sweep.differ:
        first = sweep.first_failures[0].difference if sweep.first_failures else None
        found.append(f"sweep: {sweep.differ} of {sweep.comparisons} comparisons{first_at(first, located)}")
    if bi.params_repeatable is False:
        found.append("parameter gradients not repeatable" + "".join(
            f"; {describe_param(p)}" for p in (bi.params_differences or ()) if located))
    return found + beyond_rfc_failures(bi, located)


def beyond_rfc_failures(bi: BatchInvariance, located: bool = True) -> list[str]:
    """Each failed check of the probes beyond the RFC's, in PROBES' order, as `what_failed` words them."""
    return [line for spec in registry.beyond_rfc() if spec.name in bi.beyond_rfc
            for line in spec.failures(bi.beyond_rfc[spec.name], located)]


def selected(name: str, mode: str, selection: Selection) -> bool:
    """Whether the row `name` of `mode` is one the selection names (a mode-tagged row by its untagged name)."""
    return selection == ALL or name in selection or name.removesuffix(f"[{mode}]") in selection


def failures(evidence: Evidence, selection: Selection) -> list[str]:
    """One line per selected row of `evidence` that breaks the reuse rule, in mode and row order."""
    return _judge_one(evidence, selection)[0]


def _judge_one(evidence: Evidence, selection: Selection) -> tuple[list[str], list[str], set[str]]:
    """(failure lines, the rows judged as `op/row [mode]`, the selected names met) of one file."""
    lines, judged, met = [], [], set()
    for mode, rows in evidence.results.items():
        if isinstance(rows, UnavailableMode):
            lines.append(f"{evidence.op} [{mode}]: mode unavailable: {rows.unavailable}")
            judged.append(f"{evidence.op} [{mode}]")
            met |= set(selection) if selection != ALL else set()  # every selected row of it failed with it
            continue
        for name, row in rows.items():
            if not selected(name, mode, selection):
                continue
            met.add(name.removesuffix(f"[{mode}]"))
            where = f"{evidence.op}/{name} [{mode}]"
            judged.append(where)
            if isinstance(row, UnavailableRow):
                lines.append(f"{where}: unavailable: {row.unavailable}")
            elif isinstance(row, RowResult):
                failed = what_failed(row.batch_invariance)
                if failed or not row.batch_invariance.batch_invariant:
                    lines.append(f"{where}: NOT batch-invariant: {'; '.join(failed) or 'verdict false'}")
    return lines, judged, met


@dataclass(frozen=True)
class Verdict:
    """The gate over a run's files: a line per failure, and every row it judged (`op/row [mode]`)."""

    failures: tuple[str, ...]
    judged: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


def judge(files: Sequence[Evidence], selection: Selection) -> Verdict:
    """The gate over every file of a run. A selected name that no file holds fails (the gate judged
    nothing of it), and so does a selection that judged no row at all."""
    lines, judged, met = [], [], set()
    for evidence in files:
        found, rows, names = _judge_one(evidence, selection)
        lines += found
        judged += rows
        met |= names
    if selection != ALL:
        lines += [f"{name}: selected, but no file of the run holds this row" for name in sorted(selection - met)]
    elif not judged:
        lines.append("no row to judge: the run's files hold none")
    return Verdict(tuple(lines), tuple(judged))
