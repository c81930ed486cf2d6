"""`h3bench report`, `compare`, `merge` and `index`: their arguments, handed to reports/ (commands.py,
index.py), which reads and renders evidence."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from h3bench.cli.common import FORCE, fail, flag, one_line_errors
from h3bench.harness.commands.outputs import refuse_overwrite


def report(file: Path = typer.Argument(..., metavar="FILE", help="Evidence JSON."),
           out: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help="Folder for the rendered files.",
                                              show_default="beside the JSON"),
           csv: bool = flag("--csv", "Also write <name>.csv: one line per figure (op, mode, row, check, size, "
                                     "figure, value)."),
           quiet: bool = flag("--quiet", "Print the paths only, not the verdicts."),
           show_control: bool = flag("--show-control",
                                     "Also show the run's negative control (hidden: it is not a row)."),
           force: bool = FORCE):
    """Render Markdown, HTML and plots (and with --csv a long CSV table) from an evidence file; exit 2 on bad
    input."""
    from h3bench.reports.commands import report as render_report
    from h3bench.reports.render import artifact_paths

    if out is not None and out.is_dir():
        with one_line_errors():
            refuse_overwrite(artifact_paths(file, out, csv), force, f"--out {out}")
    try:
        paths = render_report(file, out, quiet, show_control=show_control)
        if csv:
            from h3bench.reports.long_csv import write_csv
            paths.append(write_csv(file, out))
    except Exception as exc:
        fail(str(exc) if str(file) in str(exc) else f"{file}: {exc}")  # the file named once
    if not quiet:
        print("\n".join(str(p) for p in paths))


def compare(old: Path = typer.Argument(..., metavar="OLD", help="The baseline: an evidence file or a folder."),
            new: Path = typer.Argument(..., metavar="NEW", help="The new file, or a folder of them."),
            allow_missing_rows: bool = flag("--allow-missing-rows",
                                            "A row of OLD absent from NEW is not a regression (a run of fewer "
                                            "rows); a row that became unavailable still is."),
            markdown: Optional[Path] = typer.Option(
                None, "--markdown", metavar="FILE|DIR", show_default="none",
                help="Also write the comparison here (two folders: a folder, one file a pair)."),
            force: bool = FORCE):
    """What changed between two evidence files of one op, or between two folders of them (each file of NEW
    against OLD's file of its op); exit 1 on a regression, 2 on bad input."""
    from h3bench.reports.commands import compare_files, compare_folders, pair_by_op

    try:
        if old.is_dir() or new.is_dir():
            if not (old.is_dir() and new.is_dir()):
                raise ValueError("compare takes two evidence files or two folders, not one of each")
            if markdown is not None:
                if markdown.is_file():
                    raise ValueError(f"--markdown {markdown}: a file; with two folders it names a folder")
                pairs, _ = pair_by_op(old, new)
                refuse_overwrite([markdown / f"compare_{n.stem}.md" for _, n in pairs], force,
                                 f"--markdown {markdown}")
                markdown.mkdir(parents=True, exist_ok=True)
            code = compare_folders(old, new, allow_missing_rows=allow_missing_rows, markdown_dir=markdown)
        else:
            if markdown is not None:
                refuse_overwrite([markdown], force, "--markdown")
            code = compare_files(old, new, allow_missing_rows=allow_missing_rows, markdown_out=markdown)
    except Exception as exc:
        fail(str(exc))
    raise typer.Exit(code)


def merge(files: List[Path] = typer.Argument(..., metavar="FILE", help="Evidence files of the same op."),
          out: Path = typer.Option(..., "-o", "--out", metavar="FILE", help="Merged evidence JSON."),
          force: bool = FORCE):
    """Combine rows measured in separate runs; refuses differing GPU, torch or mode (exit 2)."""
    from h3bench.reports.commands import merge_files

    with one_line_errors():
        refuse_overwrite([out], force, "--out")
    try:
        path = merge_files(files, out)
    except Exception as exc:
        fail(str(exc))
    print(path)


def index(files: List[Path] = typer.Argument(..., metavar="FILE", help="Evidence files, one per op."),
          out: Path = typer.Option(Path("."), "--out", metavar="DIR", help="Folder for index.md and index.html.")):
    """One Markdown/HTML page linking several ops' evidence files, with each row's verdict."""
    from h3bench.reports.index import write_index

    try:
        paths = write_index(files, out)
    except Exception as exc:
        fail(str(exc))
    print("\n".join(str(p) for p in paths))
