"""What the commands share: bad input as one line on stderr and exit 2, and the --force option."""
from __future__ import annotations

import contextlib
from typing import Iterator, NoReturn

import typer
from rich.markup import escape

from h3bench.harness.commands import BadInput
from h3bench.harness.console import make_console



def flag(name: str, help: str, hidden: bool = False):
    """An option that is off unless given (its default goes unsaid)."""
    return typer.Option(False, name, show_default=False, hidden=hidden, help=help)


FORCE = flag("--force", "Overwrite the files the output option names if they exist.")


def fail(message: str, code: int = 2) -> NoReturn:
    make_console(stderr=True).print(f"[red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """A BadInput raised in the block ends the command: its message, one line, exit 2."""
    try:
        yield
    except BadInput as exc:
        fail(str(exc))
