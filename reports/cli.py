"""The `h3bench` program: harness's measuring commands (run, list, env, validate) plus the ones that read
evidence (report, compare, merge), and the renderers `run` calls after writing its JSON.

harness/ never imports reports/ (data flows one way: measurements -> JSON -> renderings), so the two
halves meet here.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from h3bench.harness import cli as harness_cli
from h3bench.harness.cli import app, fail

__all__ = ["app", "main"]


def render_after_run(paths: list[Path], console: Console) -> list[Path]:
    """Markdown, HTML and plots beside each evidence file; an index page when a run wrote several."""
    from h3bench.reports.index import write_index
    from h3bench.reports.render import render_all

    written: list[Path] = []
    for path in paths:
        written += render_all(path)
    if len(paths) > 1:
        written += write_index(paths, Path(paths[0]).parent)
    return written


harness_cli.RENDER_HOOKS.append(render_after_run)


@app.command()
def report(file: Path = typer.Argument(..., help="Evidence JSON."),
           out: Optional[Path] = typer.Option(None, "--out", help="Folder for the rendered files."),
           csv: bool = typer.Option(False, "--csv", help="Also write <name>.csv: one line per figure (op, mode, "
                                                          "row, check, size, figure, value)."),
           quiet: bool = typer.Option(False, "--quiet"),
           show_control: bool = typer.Option(False, "--show-control", help="Also show the run's negative control "
                                                                          "(hidden: it is not a row).")):
    """Render Markdown, HTML and plots (and with --csv a long CSV table) from an evidence file."""
    from h3bench.reports.commands import report as render_report

    try:
        paths = render_report(file, out, quiet, show_control=show_control)
        if csv:
            from h3bench.reports.long_csv import write_csv
            paths.append(write_csv(file, out))
    except Exception as exc:
        fail(f"{file}: {exc}", 1)
    if not quiet:
        print("\n".join(str(p) for p in paths))


@app.command()
def compare(old: Path = typer.Argument(...), new: Path = typer.Argument(...),
            allow_missing_rows: bool = typer.Option(
                False, "--allow-missing-rows", help="A row of OLD absent from NEW is not a regression (a run of "
                                                    "fewer rows); a row that became unavailable still is."),
            markdown: Optional[Path] = typer.Option(
                None, "--markdown", help="Also write the comparison here (two folders: a folder, one file a pair).")):
    """What changed between two evidence files of one op, or between two folders of them (each file of NEW
    against OLD's file of its op); exit 1 on a regression, 2 on bad input."""
    from h3bench.reports.commands import compare_files, compare_folders

    try:
        if old.is_dir() or new.is_dir():
            if not (old.is_dir() and new.is_dir()):
                raise ValueError("compare takes two evidence files or two folders, not one of each")
            if markdown is not None:
                markdown.mkdir(parents=True, exist_ok=True)
            code = compare_folders(old, new, allow_missing_rows=allow_missing_rows, markdown_dir=markdown)
        else:
            code = compare_files(old, new, allow_missing_rows=allow_missing_rows, markdown_out=markdown)
    except Exception as exc:
        fail(str(exc), 2)
    raise typer.Exit(code)


@app.command()
def merge(files: List[Path] = typer.Argument(..., help="Evidence files of the same op."),
          out: Path = typer.Option(..., "-o", "--out", help="Merged evidence JSON.")):
    """Combine rows measured in separate runs; refuses differing GPU, torch or mode."""
    from h3bench.reports.commands import merge_files

    try:
        path = merge_files(files, out)
    except Exception as exc:
        fail(str(exc), 2)
    print(path)


@app.command()
def index(files: List[Path] = typer.Argument(..., help="Evidence files, one per op."),
          out: Path = typer.Option(Path("."), "--out", help="Folder for index.md and index.html.")):
    """One Markdown/HTML page linking several ops' evidence files, with each row's verdict."""
    from h3bench.reports.index import write_index

    try:
        paths = write_index(files, out)
    except Exception as exc:
        fail(str(exc), 2)
    print("\n".join(str(p) for p in paths))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
