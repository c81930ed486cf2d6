"""The `h3bench` program and its one composition root: harness's measuring commands (run, list, env,
validate), built around the adapter registry (adapters/) and the renderers (reports/) handed to them,
plus the commands that read evidence (report, compare, merge, index).

harness/ imports neither adapters/ nor reports/ (data flows one way: measurements -> JSON -> renderings);
this module, in the top layer, is where the three meet. A mode's child process runs this module again
(`CHILD_PROGRAM`), so it has the same registry.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from h3bench.harness.cli import Program, fail, make_app, refuse_overwrite

__all__ = ["app", "build_app", "main"]

# How a child process starts this program (a mode's child, a fan-out job): this module, by its name.
CHILD_PROGRAM = (sys.executable, "-m", "h3bench.reports.cli")


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


FORCE = typer.Option(False, "--force", metavar="", show_default=False,
                     help="Overwrite the files the output option names if they exist.")


def report(file: Path = typer.Argument(..., help="Evidence JSON."),
           out: Optional[Path] = typer.Option(None, "--out", help="Folder for the rendered files.",
                                              show_default="beside the JSON"),
           csv: bool = typer.Option(False, "--csv", metavar="", show_default=False,
                                    help="Also write <name>.csv: one line per figure (op, mode, row, check, size, "
                                         "figure, value)."),
           quiet: bool = typer.Option(False, "--quiet", metavar="", show_default=False,
                                      help="Print the paths only, not the verdicts."),
           show_control: bool = typer.Option(False, "--show-control", metavar="", show_default=False,
                                             help="Also show the run's negative control (hidden: it is not a row)."),
           force: bool = FORCE):
    """Render Markdown, HTML and plots (and with --csv a long CSV table) from an evidence file; exit 2 on bad
    input."""
    from h3bench.reports.commands import report as render_report
    from h3bench.reports.render import artifact_paths

    if out is not None and out.is_dir():
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


def compare(old: Path = typer.Argument(...), new: Path = typer.Argument(...),
            allow_missing_rows: bool = typer.Option(
                False, "--allow-missing-rows", metavar="", show_default=False,
                help="A row of OLD absent from NEW is not a regression (a run of fewer rows); a row that became "
                     "unavailable still is."),
            markdown: Optional[Path] = typer.Option(
                None, "--markdown", show_default="none",
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
    except typer.Exit:
        raise
    except Exception as exc:
        fail(str(exc))
    raise typer.Exit(code)


def merge(files: List[Path] = typer.Argument(..., help="Evidence files of the same op."),
          out: Path = typer.Option(..., "-o", "--out", help="Merged evidence JSON."),
          force: bool = FORCE):
    """Combine rows measured in separate runs; refuses differing GPU, torch or mode (exit 2)."""
    from h3bench.reports.commands import merge_files

    refuse_overwrite([out], force, "--out")
    try:
        path = merge_files(files, out)
    except Exception as exc:
        fail(str(exc))
    print(path)


def index(files: List[Path] = typer.Argument(..., help="Evidence files, one per op."),
          out: Path = typer.Option(Path("."), "--out", help="Folder for index.md and index.html.")):
    """One Markdown/HTML page linking several ops' evidence files, with each row's verdict."""
    from h3bench.reports.index import write_index

    try:
        paths = write_index(files, out)
    except Exception as exc:
        fail(str(exc))
    print("\n".join(str(p) for p in paths))


# The registry is imported when a command asks for it, not when the program starts: it imports torch, which
# `h3bench --help` and `h3bench report` do not need.
def builtin_adapters(op: str) -> list:
    from h3bench.adapters import builtin_adapters as registry

    return registry(op)


def control_composition(op: str):
    from h3bench.adapters import control_composition as composition

    return composition(op)


def model_command():
    """`h3bench model`: its options in reports/model_command.py, its logic in harness/model_audit/."""
    from h3bench.reports.model_command import model

    return model


def build_app() -> typer.Typer:
    """The whole program: the measuring commands around the built-in registry and the renderers, and the
    commands that read evidence."""
    app = make_app(Program(builtin_adapters=builtin_adapters, control_adapter=control_composition,
                           child_program=CHILD_PROGRAM, render_hooks=(render_after_run,)))
    app.command()(report)
    app.command()(compare)
    app.command()(merge)
    app.command()(index)
    app.command("model")(model_command())
    return app


app = build_app()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
