"""Markdown table comparing two evidence files of one op verdict by verdict (e.g. the RFC's B200 file
against ours): per mode and row, each file's verdict with its failing counts, and whether they agree.

    python -m tools.verdict_table PRIOR.json OURS.json [--prior-label LABEL] [--label LABEL]
    python -m tools.verdict_table --summary PRIOR.json OURS.json [PRIOR.json OURS.json ...]

With --summary, one line per pair: the rows whose verdicts both files have and how many agree, the rows
unavailable in OURS (with the prior's verdict), and the rows only one file measures. The columns are
labelled with each file's GPU model as its environment records it (`--prior-label`, `--label`: others).
"""
from __future__ import annotations

import argparse
import re
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


def gpu_label(evidence: schema.Evidence, who: str) -> str:
    """`who` with the file's GPU model ("H100 (h3bench)" for an NVIDIA H100 80GB HBM3's file), or its
    device where no GPU is recorded."""
    gpu = evidence.environment.gpu
    model = re.search(r"\b([A-Z]+\d{2,4}[A-Za-z]?)\b", gpu or "")
    return f"{model.group(1) if model else gpu or evidence.environment.device or 'unknown GPU'} ({who})"


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


def compared(prior: schema.Evidence, ours: schema.Evidence) -> dict[str, list[str]]:
    """`mode/row` names: "same" and "differ" (both files have a verdict), "unavailable" (OURS has the row
    unavailable, or its whole mode), "ours only" and "prior only" (the other file lacks the row)."""
    found: dict[str, list[str]] = {"same": [], "differ": [], "unavailable": [], "ours only": [], "prior only": []}
    for mode in list(prior.results) + [m for m in ours.results if m not in prior.results]:
        a, b = prior.rows(mode), ours.rows(mode)
        mode_gone = isinstance(ours.results.get(mode), UnavailableMode)
        for name in list(a) + [n for n in b if n not in a]:
            (va, _), (vb, _) = verdict(a.get(name)), verdict(b.get(name))
            key = f"{mode}/{name}"
            if va is not None and vb is not None:
                found["same" if va == vb else "differ"].append(key)
            elif name in b and name in a or mode_gone:
                found["unavailable"].append(key)
            else:
                found["ours only" if name in b else "prior only"].append(key)
    return found


def summary(pairs: list[tuple[Path, Path]]) -> str:
    out = ["| ours | verdicts in both | same | unavailable in ours | only in ours | only in the prior |",
           "| --- | ---: | ---: | --- | --- | --- |"]
    for prior_path, ours_path in pairs:
        c = compared(schema.load(prior_path), schema.load(ours_path))
        names = [", ".join(c[k]) or "-" for k in ("unavailable", "ours only", "prior only")]
        same = f"{len(c['same'])}" + (f" (differ: {', '.join(c['differ'])})" if c["differ"] else "")
        out.append(f"| {ours_path.name} | {len(c['same']) + len(c['differ'])} | {same} | " + " | ".join(names) + " |")
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="PRIOR OURS, or with --summary several such pairs")
    parser.add_argument("--summary", action="store_true", help="one line per pair instead of the full table")
    parser.add_argument("--prior-label", default=None, help="default: PRIOR's GPU model, e.g. B200 (RFC)")
    parser.add_argument("--label", default=None, help="default: OURS's GPU model, e.g. H100 (h3bench)")
    args = parser.parse_args(argv)
    if len(args.files) % 2 or (len(args.files) > 2 and not args.summary):
        parser.error("give PRIOR OURS (one pair; several pairs with --summary)")
    pairs = list(zip(args.files[::2], args.files[1::2]))
    if args.summary:
        print(summary(pairs))
    else:
        prior, ours = schema.load(pairs[0][0]), schema.load(pairs[0][1])
        print(table(prior, ours, args.prior_label or gpu_label(prior, "RFC"), args.label or gpu_label(ours, "h3bench")))


if __name__ == "__main__":
    main()
