"""Where h3bench prints: at a terminal, rich fits tables to the window (long cells fold onto more lines,
never cut); anywhere else (a pipe, a CI log, a file) lines take their natural width, whatever COLUMNS
says, so that a row name a user must type and a number are printed whole. Tables printed there stay within
PIPED_TABLE_WIDTH, folding long reasons, and so do lines of prose (`fold`), broken between words only."""
from __future__ import annotations

import sys
import textwrap
from typing import Iterable

from rich.console import Console

# wide enough for any table h3bench prints; rich pads nothing to it (tables take their natural width)
NATURAL_WIDTH = 100_000
# Tables and prose piped (`| cat`, a CI log) stay this wide: `list` and the run's summary fold long reasons
# onto more lines, never cut; names keep their width.
PIPED_TABLE_WIDTH = 160
# textwrap breaks at these characters only: a no-break space keeps a path with spaces in one piece
_NO_BREAK_SPACE = "\u00a0"


def make_console(*, stderr: bool = False, quiet: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    terminal = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, quiet=quiet, **({} if terminal else {"width": NATURAL_WIDTH, "soft_wrap": True}))


def table_console() -> Console:
    """Stdout for a table: a terminal's width, else PIPED_TABLE_WIDTH."""
    console = make_console()
    return console if console.is_terminal else Console(width=PIPED_TABLE_WIDTH, soft_wrap=False)


def line_width(console: Console) -> int:
    """Where a line of prose on `console` folds: the terminal's width, else PIPED_TABLE_WIDTH."""
    return console.width if console.is_terminal else PIPED_TABLE_WIDTH


def fold(text: str, width: int, whole: Iterable[str] = ()) -> str:
    """`text` in lines of at most `width` characters, broken at spaces only (the lines after the first
    indented two), never inside a word or inside one of the `whole` strings (paths: a path longer than the
    width gets a line of its own, uncut)."""
    kept = sorted({w for w in whole if " " in w}, key=len, reverse=True)
    for piece in kept:
        text = text.replace(piece, piece.replace(" ", _NO_BREAK_SPACE))
    folded = textwrap.fill(text, width=max(width, 20), subsequent_indent="  ", break_long_words=False,
                           break_on_hyphens=False)
    return folded.replace(_NO_BREAK_SPACE, " ")


def say(console: Console, text: str, *, style: str = "", label: str = "", whole: Iterable[str] = ()) -> None:
    """Print a line of prose folded to `line_width(console)` (`fold`): `label` first, in `style`, then `text`;
    without a label the whole line is in `style`."""
    from rich.markup import escape

    folded = fold(f"{label} {text}" if label else text, line_width(console), whole)
    head, body = (folded[:len(label)], folded[len(label):]) if label else (folded, "")
    styled = f"[{style}]{escape(head)}[/]" if style else escape(head)
    console.print(styled + escape(body), highlight=False)
