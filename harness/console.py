"""Where h3bench prints: at a terminal, rich fits tables to the window (long cells fold onto more lines,
never cut); anywhere else (a pipe, a CI log, a file) lines take their natural width, whatever COLUMNS
says, so that a row name a user must type and a number are printed whole (the CLI prints its tables there
within 160 columns, folding long reasons: harness/cli.py's PIPED_TABLE_WIDTH)."""
from __future__ import annotations

import sys

from rich.console import Console

# wide enough for any table h3bench prints; rich pads nothing to it (tables take their natural width)
NATURAL_WIDTH = 100_000


def make_console(*, stderr: bool = False, quiet: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    terminal = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, quiet=quiet, **({} if terminal else {"width": NATURAL_WIDTH, "soft_wrap": True}))
