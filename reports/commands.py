"""What the `report`, `compare` and `merge` commands do; h3bench.cli (harness/cli/evidence.py) parses their
arguments.

Errors are raised, not printed: FileNotFoundError, schema.SchemaError, merge.MergeError.
"""
from __future__ import annotations

from functools import reduce
from pathlib import Path
from typing import Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from h3bench.harness import schema
from h3bench.harness.console import make_console
from h3bench.reports import fmt
from h3bench.reports.compare import (ERROR_GROWTH_FACTOR, LATENCY_NOISE, Comparison, Quantity, Thresholds, compare,
                             render_comparison)
from h3bench.harness.merge import merge
from h3bench.reports.render import render_all
from h3bench.reports.table import mode_summary


def load(path: Path) -> schema.Evidence:
    path = Path(path)
    if not path.exists():   # a folder goes on to schema.load, which names it
        raise FileNotFoundError(f"evidence file not found: {path}")
    return schema.load(path)


def report(file: Path, out: Optional[Path] = None, quiet: bool = False,
           console: Optional[Console] = None, show_control: bool = False) -> list[Path]:
    """Render FILE's Markdown, HTML and PNGs next to it (or into OUT); returns the paths written.

    Unless quiet, prints the verdict summary of each mode (and with `show_control` the negative control's
    line); listing the paths is the caller's job.
    """
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise NotADirectoryError(f"--out {out} is a file: the rendered files go into a folder")
    paths = render_all(file, out, show_control)
    if not quiet:
        evidence = load(file)
        console = console or make_console()
        for mode in evidence.results:
            console.print(f"{escape(mode)}: {escape(mode_summary(evidence, mode))}", highlight=False)
        if show_control:
            from h3bench.harness.control import summary_line
            console.print(escape(summary_line(evidence) or "control: none recorded"), highlight=False)
    return paths


def _worst(quantities: Sequence[Quantity]) -> str:
    if not quantities:
        return fmt.MISSING
    q = max(quantities, key=lambda q: q.ratio)
    text = escape(f"{q.name} {fmt.ratio(q.ratio)}")
    return f"[bold red]{text}[/]" if any(x.regression for x in quantities) else text


def _red(text: str, red: bool) -> str:
    return f"[bold red]{escape(text)}[/]" if red else escape(text)


def comparison_table(comparison: Comparison) -> Table:
    table = Table(title="h3bench compare (worst new/old ratio per row)")
    for column in ("mode", "row", "status"):
        table.add_column(column, no_wrap=True)  # identifiers: wrapping them makes them unsearchable
    for column in ("verdict flips", "latency", "error"):
        table.add_column(column)
    for c in comparison.rows:
        flips = ", ".join(_red(f"{f.verdict} {fmt.tri(f.old)} -> {fmt.tri(f.new)}", f.regression) for f in c.flips)
        status = _red(c.status, c.status in ("became_unavailable", "missing"))
        table.add_row(escape(c.mode), escape(c.row), status, flips, _worst(c.latency), _worst(c.errors))
    return table


def compare_files(old: Path, new: Path, error_factor: float = ERROR_GROWTH_FACTOR,
                  latency_noise: float = LATENCY_NOISE, allow_missing_rows: bool = False,
                  markdown_out: Optional[Path] = None, console: Optional[Console] = None) -> int:
    """Print the comparison of OLD (baseline) and NEW; 0 if nothing regressed, 1 otherwise."""
    thresholds = Thresholds(error_factor=error_factor, latency_noise=latency_noise,
                            allow_missing_rows=allow_missing_rows)
    comparison = compare(load(old), load(new), thresholds)
    console = console or make_console()
    console.print(comparison_table(comparison))
    for note in comparison.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if comparison.regressions:
        console.print(f"[bold red]{len(comparison.regressions)} regression(s):[/]")
        for r in comparison.regressions:
            console.print(f"  [red]{r.kind}[/] {escape(f'[{r.mode}] {r.message}')}", highlight=False)
    else:
        console.print("[green]no regression[/]")
    if markdown_out is not None:
        schema.write_atomic(markdown_out, render_comparison(comparison))
    return 1 if comparison.has_regression else 0


def evidence_files(folder: Path) -> dict[Path, schema.Evidence]:
    """The evidence files directly in `folder` (other JSON, such as a sweep's, is not one and is left out)."""
    found = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            found[path] = load(path)
        except (schema.SchemaError, ValueError):
            continue
    return found


def pair_by_op(old_dir: Path, new_dir: Path) -> tuple[list[tuple[Path, Path]], list[str]]:
    """(old, new) pairs: each evidence file of NEW_DIR with OLD_DIR's file of the same op: the one of the same
    name if there is one, else the one with the same modes, else the one sharing a mode with it (a committed
    folder keeps an op's plain-mode file beside its modes file); and a line for each NEW file with no such
    partner. Two candidates left at the first rule that finds any is an error: which baseline is meant
    cannot be guessed."""
    old, new = evidence_files(old_dir), evidence_files(new_dir)
    pairs, unmatched = [], []
    for path, evidence in new.items():
        same_op = [p for p, e in old.items() if e.op == evidence.op]
        modes = set(evidence.results)
        candidates = ([p for p in same_op if p.name == path.name]
                      or [p for p in same_op if set(old[p].results) == modes]
                      or [p for p in same_op if set(old[p].results) & modes])
        if len(candidates) > 1:
            raise ValueError(f"{path.name}: several files of op {evidence.op} in {old_dir} share its modes "
                             f"({', '.join(p.name for p in candidates)}); compare the files themselves")
        if candidates:
            pairs.append((candidates[0], path))
        else:
            unmatched.append(f"{path.name}: no file of op {evidence.op} with its modes in {old_dir}")
    return pairs, unmatched


def compare_folders(old_dir: Path, new_dir: Path, allow_missing_rows: bool = False,
                    markdown_dir: Optional[Path] = None, console: Optional[Console] = None) -> int:
    """`compare_files` for each (old, new) pair of `pair_by_op`: 0 if none regressed, 1 if one did; a NEW file
    without a partner is listed, not failed; no pair at all is an error (ValueError)."""
    pairs, unmatched = pair_by_op(old_dir, new_dir)
    if not pairs:
        raise ValueError(f"no evidence file of {new_dir} has a file of its op in {old_dir}")
    console = console or make_console()
    worst = 0
    for old, new in pairs:
        console.print(f"[bold]{escape(f'{old} -> {new}')}[/]", highlight=False)
        markdown = None if markdown_dir is None else Path(markdown_dir) / f"compare_{new.stem}.md"
        worst = max(worst, compare_files(old, new, allow_missing_rows=allow_missing_rows, markdown_out=markdown,
                                         console=console))
    for line in unmatched:
        console.print(f"[yellow]not compared:[/] {escape(line)}", highlight=False)
    return worst


def merge_files(inputs: Sequence[Path], out: Path) -> Path:
    """Merge the evidence files INPUTS (at least two) into OUT, written atomically."""
    if len(inputs) < 2:
        raise ValueError(f"merge needs at least two evidence files, got {len(inputs)}")
    merged = reduce(merge, (load(p) for p in inputs))
    # Round-trip through the strict codec: a merge that breaks the contract must not reach disk.
    schema.from_json(schema.to_dict(merged))
    return schema.save(merged, out)
