"""`h3bench list`, `env` and `validate`: their arguments, handed to harness (harness/commands/)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from h3bench.cli.common import one_line_errors
from h3bench.harness.commands import Program, resolve_device

DEVICE_METAVAR = "auto|cuda|cpu"


def list_(ctx: typer.Context,
          device: str = typer.Option("auto", "--device", metavar=DEVICE_METAVAR,
                                     help="Where availability is judged."),
          op: Optional[str] = typer.Option(None, "--op", metavar="NAME|PATH.py:ATTR", show_default="every op",
                                           help="One op (or a user op): its call signature, then its rows with "
                                                "their whole sources.")):
    """Ops with their rows, each available, skipped or unavailable, with the reason; with --op, the op's call
    signature (shapes, dtypes, roles, formula) and each row's whole source."""
    from h3bench.harness.commands.listing import list_rows

    with one_line_errors():
        list_rows(ctx.find_object(Program), resolve_device(device), op)


def env(device: str = typer.Option("auto", "--device", metavar=DEVICE_METAVAR, help="Where to look."),
        bandwidth: bool = typer.Option(True, "--bandwidth/--no-bandwidth",
                                       help="Measure copy, read and write bandwidth.")):
    """Print the environment block an evidence file would record."""
    import json

    from h3bench.harness import environment
    from h3bench.harness.schema import to_dict

    with one_line_errors():
        dev = resolve_device(device)
    block = environment.capture(dev, {"plain": {}}, measure_bandwidth=bandwidth)
    print(json.dumps(to_dict(block), indent=2))


def validate(files: List[Path] = typer.Argument(..., metavar="FILE",
                                                help="Evidence JSON file(s) (or norm_modulate sweep files)."),
             op: List[str] = typer.Option([], "--op", metavar="PATH.py:ATTR", show_default=False,
                                          help="A user op the files are of: PATH.py:ATTR, module:ATTR or an "
                                               "h3bench.ops entry point.")):
    """Check files against the contract (keys, nesting, types) and for meaning (figures, counts, verdicts,
    plan totals); every file is checked and each problem named; exit 1 if any file fails, 2 if a file is
    missing or a folder (bad input)."""
    from h3bench.harness.commands.validate import validate_files

    with one_line_errors():
        code = validate_files(files, op)
    raise typer.Exit(code)
