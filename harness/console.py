"""Where h3bench prints: at a terminal, rich fits tables to the window (long cells fold onto more lines,
never cut); anywhere else (a pipe, a CI log, a file) lines take their natural width, whatever COLUMNS
says, so that a row name a user must type and a number are printed whole. Tables printed there stay within
PIPED_TABLE_WIDTH, folding long reasons."""
from __future__ import annotations

import sys

from rich.console import Console

# wide enough for any table h3bench prints; rich pads nothing to it (tables take their natural width)
NATURAL_WIDTH = 100_000
# Tables piped (`| cat`, a CI log) stay this wide: `list` and the run's summary fold long reasons onto more
# lines, never cut; names keep their width.
PIPED_TABLE_WIDTH = 160


def make_console(*, stderr: bool = False, quiet: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    terminal = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, quiet=quiet, **({} if terminal else {"width": NATURAL_WIDTH, "soft_wrap": True}))


def table_console() -> Console:
    """Stdout for a table: a terminal's width, else PIPED_TABLE_WIDTH."""
    console = make_console()
    return console if console.is_terminal else Console(width=PIPED_TABLE_WIDTH, soft_wrap=False)
