"""Markdown table comparing two evidence files of one op verdict by verdict (e.g. the RFC's B200 file
against ours): per mode and row, each file's verdict with its failing counts, and whether they agree.

    python -m tools.verdict_table PRIOR.json OURS.json [--prior-label B200] [--label H200]
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from h3bench.harness import schema
from h3bench.harness.schema import RowResult, UnavailableMode


def verdict(row) -> tuple[Optional[bool], str]:
    """(batch_invariant or None when unmeasured, the verdict in words with its failing counts)."""
    from h3bench.reports.verdicts import failure_summary

    if row is None:
        return None, "not in the file"
    if not isinstance(row, RowResult):
        return None, f"unavailable ({row.unavailable})"
    bi = row.batch_invariance
    if bi.batch_invariant:
        params = {True: ", params repeat", None: ", no parameter gradients measured", False: ""}[bi.params_repeatable]
        return True, f"invariant{params}"
    return False, f"NOT invariant: {failure_summary(row)}"


def table(prior: schema.Evidence, ours: schema.Evidence, prior_label: str, label: str) -> str:
    out = [f"| mode | row | {prior_label} | {label} | same verdict? |", "| --- | --- | --- | --- | --- |"]
    for mode in list(prior.results) + [m for m in ours.results if m not in prior.results]:
        a, b = prior.rows(mode), ours.rows(mode)
        if isinstance(ours.results.get(mode), UnavailableMode):
            out.append(f"| {mode} | (all) | - | mode unavailable: {ours.results[mode].unavailable} | - |")
        for name in list(a) + [n for n in b if n not in a]:
            (va, ta), (vb, tb) = verdict(a.get(name)), verdict(b.get(name))
            same = "-" if va is None or vb is None else ("yes" if va == vb else "**no**")
            out.append(f"| {mode} | {name} | {ta.replace('|', '/')} | {tb.replace('|', '/')} | {same} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prior", type=Path)
    parser.add_argument("ours", type=Path)
    parser.add_argument("--prior-label", default="B200 (RFC)")
    parser.add_argument("--label", default="H200 (h3bench)")
    args = parser.parse_args()
    print(table(schema.load(args.prior), schema.load(args.ours), args.prior_label, args.label))


if __name__ == "__main__":
    main()
