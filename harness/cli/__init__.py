"""The `h3bench` program: its command line, and the program's one composition root.

This package (installed as `h3bench.cli`; its code lives in harness/cli/) parses every command's arguments
and is the only place where harness/, adapters/ and reports/ meet: harness's measuring commands
(harness/commands/) get the adapter registry and the renderers in a `Program`; the commands that read
evidence call reports/. A mode's child process and a fan-out job start this package again
(`CHILD_PROGRAM`), so they have the same registry.

The registry and the renderers are imported when a command asks for them: they import torch and
matplotlib, which `h3bench --help` does not need.
"""
from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import typer
from rich.console import Console

from h3bench.cli import evidence, measure
from h3bench.cli.model import model
from h3bench.cli.run import run
from h3bench.harness.commands import Program

__all__ = ["CHILD_PROGRAM", "app", "build_app", "main"]

# How a child process starts this program (a mode's child, a fan-out job): this package, by its name.
CHILD_PROGRAM = (sys.executable, "-m", "h3bench.cli")
HELP = "Batch-invariance, accuracy and latency evidence for GPU kernels."


def builtin_adapters(op: str) -> list:
    from h3bench.adapters import builtin_adapters as registry

    return registry(op)


def control_composition(op: str):
    from h3bench.adapters import control_composition as composition

    return composition(op)


def render_after_run(paths: list[Path], console: Console) -> list[Path]:
    from h3bench.reports.render import render_run

    return render_run(paths)


PROGRAM = Program(builtin_adapters=builtin_adapters, control_adapter=control_composition,
                  child_program=CHILD_PROGRAM, render_hooks=(render_after_run,))


def _print_version(value: bool) -> None:
    if value:
        try:
            version = metadata.version("h3bench")
        except metadata.PackageNotFoundError:  # a checkout on PYTHONPATH (tools/link_package.sh), not installed
            version = "not installed"
        print(f"h3bench {version}")
        raise typer.Exit()


def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="Print h3bench's version and exit.")) -> None:
    """Batch-invariance, accuracy and latency evidence for GPU kernels."""


# Each command's line in `h3bench -h`: short enough for an 80-column help, whole (click cuts a long one).
SHORT_HELP = {
    "run": "Measure rows through the probes; write evidence JSON.",
    "list": "Ops and their rows (available, skipped, unavailable).",
    "env": "The environment block an evidence file would record.",
    "validate": "Check evidence files for the contract and meaning.",
    "report": "Markdown, HTML and plots from an evidence file.",
    "compare": "What changed between two evidence files or folders.",
    "merge": "Rows of separate runs of one op in one file.",
    "index": "One page linking several ops' evidence files.",
    "model": "Where a model's batch invariance breaks: module, op, pass.",
}


def build_app(program: Program = PROGRAM) -> typer.Typer:
    """The whole program: the measuring commands around `program`, and the commands that read evidence."""
    # Plain help (rich_markup_mode None): click's layout folds option names, metavars and defaults onto more
    # lines where rich's table cut them at 80 columns. A harness error's traceback: rich's panel at a
    # terminal; Python's own anywhere else, where its last line is the whole exception (a fan-out's failure
    # reason is that last line: harness/fanout.py).
    app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP, rich_markup_mode=None,
                      pretty_exceptions_enable=sys.stderr.isatty(),
                      context_settings={"help_option_names": ["-h", "--help"], "obj": program})
    app.callback()(_options)
    for name, command in (("run", run), ("list", measure.list_), ("env", measure.env),
                          ("validate", measure.validate), ("report", evidence.report),
                          ("compare", evidence.compare), ("merge", evidence.merge), ("index", evidence.index),
                          ("model", model)):
        app.command(name, short_help=SHORT_HELP[name])(command)
    return app


app = build_app()


def main() -> None:
    from h3bench.harness.compile_cache import keep_inductor_caches

    keep_inductor_caches()  # the program's, not an import's: a library must not move a user's caches
    app()
