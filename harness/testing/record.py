"""What `check_batch_invariance` returns: one typed, frozen record per check of a function, built from the
probes' own record (the BatchInvariance record of harness/schema.py) and worded as the CI gate words a failing row
(harness/gate.py), so a test's message and `h3bench run --require-invariant` say the same thing."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from h3bench.harness.gate import what_failed
from h3bench.harness.localize.records import Localisation, Origin
from h3bench.harness.schema import BatchInvariance, Difference, ParamDifference


@dataclass(frozen=True)
class CheckCount:
    """One check's counts: `compared` things of `unit` (rows, sub-batches, comparisons, parameter gradients),
    `differ` of them differed. Where the check keeps the forward and the row gradients apart (all_rows, the
    sub-batches) `differ` is their sum and both are given; the sweep counts comparisons where anything
    differed, the parameter check gradients that did not repeat."""

    compared: int
    unit: str
    differ: int
    fwd_differ: Optional[int] = None
    rowgrad_differ: Optional[int] = None


@dataclass(frozen=True)
class InvarianceCheck:
    """The verdict on one function: `invariant` (no check counted a difference and parameter gradients
    repeated), the counts per check (`all_rows N` per batch size, `full_vs_sub_batches`,
    `batch_size_sweep`, and `param_grads` when an input is a parameter with a gradient), where each failing
    check first differed (`first_differences`, and `param_differences` for gradients that moved) and the
    gate's one line per failed check (`failures`). `unavailable`: why the function could not be judged
    (it raised, returned a non-tensor or broke the output contract); then nothing was counted and
    `failures` is that one line."""

    name: str
    plan: str
    device: str
    invariant: bool
    counts: Mapping[str, CheckCount] = field(default_factory=dict)
    first_differences: Mapping[str, Difference] = field(default_factory=dict)
    param_differences: tuple[ParamDifference, ...] = ()
    failures: tuple[str, ...] = ()
    unavailable: Optional[str] = None
    seconds: float = 0.0
    batch_invariance: Optional[BatchInvariance] = None  # the probes' record, as an evidence file's row holds it
    # where the rows part, earliest first (harness/localize/), from the searches in `localisations`
    origins: tuple[Origin, ...] = ()
    localisations: tuple[Localisation, ...] = ()

    def message(self) -> str:
        """What `assert_batch_invariant` raises with: one line when unavailable, else a header and one line
        per failed check (empty when invariant)."""
        if self.unavailable is not None:
            return f"{self.name}: {self.failures[0]}"
        if self.invariant:
            return ""
        lines = "\n".join(f"  {line}" for line in (*self.failures, *self._located()))
        return f"{self.name} is not batch-invariant ({self.plan} plan on {self.device}):\n{lines}"

    def _located(self) -> list[str]:
        if not self.localisations:
            return []
        if not self.origins:
            notes = "; ".join(s.note for s in self.localisations if s.note) or "no op or module parts the rows"
            return [f"origin: none found ({notes})"]
        more = f" (and {len(self.origins) - 1} more origin(s): .origins)" if len(self.origins) > 1 else ""
        return [f"first origin: {self.origins[0].describe()}{more}"]


def unavailable(name: str, plan: str, device: str, reason: str, seconds: float) -> InvarianceCheck:
    return InvarianceCheck(name=name, plan=plan, device=device, invariant=False,
                           failures=(f"unavailable: {reason}",), unavailable=reason, seconds=seconds)


def from_probes(name: str, plan: str, device: str, bi: BatchInvariance, param_grads: tuple[str, ...],
                seconds: float, localisations: tuple[Localisation, ...] = ()) -> InvarianceCheck:
    """The record of a function the probes ran through: counts and first differences from `bi`."""
    counts: dict[str, CheckCount] = {}
    firsts: dict[str, Difference] = {}
    for size, case in bi.all_rows.items():
        check = f"all_rows {size}"
        counts[check] = CheckCount(case.rows, "rows", case.fwd_differ + case.rowgrad_differ, case.fwd_differ,
                                   case.rowgrad_differ)
        if case.first_difference is not None:
            firsts[check] = case.first_difference
    subs = bi.full_vs_sub_batches
    counts["full_vs_sub_batches"] = CheckCount(subs.sub_batches, "sub-batches", subs.fwd_differ + subs.rowgrad_differ,
                                               subs.fwd_differ, subs.rowgrad_differ)
    if subs.first_difference is not None:
        firsts["full_vs_sub_batches"] = subs.first_difference
    sweep = bi.batch_size_sweep
    counts["batch_size_sweep"] = CheckCount(sweep.comparisons, "comparisons", sweep.differ)
    located = next((f.difference for f in sweep.first_failures if f.difference is not None), None)
    if located is not None:
        firsts["batch_size_sweep"] = located
    moved = tuple(bi.params_differences or ())
    if param_grads:
        counts["param_grads"] = CheckCount(len(param_grads), "parameter gradients", len(moved))
    return InvarianceCheck(name=name, plan=plan, device=device, invariant=bi.batch_invariant, counts=counts,
                           first_differences=firsts, param_differences=moved, failures=tuple(what_failed(bi)),
                           seconds=seconds, batch_invariance=bi, localisations=localisations,
                           origins=tuple(o for s in localisations for o in s.origins))
