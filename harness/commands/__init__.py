"""The measuring commands' logic (run, list, validate), without their argument parsing.

h3bench.cli (harness/cli/) parses the command line and hands in a `Program`: what harness/ does not import
(the adapter registry, the control's composition, the renderers `run` calls after writing its JSON, and the
command that starts the program again in a child process). Bad input is a `BadInput`, whose message is the
one line the user sees (exit 2), raised before anything is measured.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from rich.console import Console

ALL_OPS = "all"

# Called after a run with the written evidence paths and the console; each returns the files it wrote.
RenderHook = Callable[[list[Path], Console], list[Path]]


class BadInput(Exception):
    """The user's input is wrong (a flag, a file, a name): one line, no traceback, exit 2."""


@dataclass(frozen=True)
class Program:
    """What the measuring commands get from the program's composition root instead of importing it."""

    builtin_adapters: Callable[[str], list]          # an op's built-in rows (Adapter), in registry order
    control_adapter: Callable[[str], Optional[object]]  # the op's row the control plants its fault in, or None
    child_program: tuple[str, ...]                   # the command that starts this program in a child process
    render_hooks: Sequence[RenderHook] = ()          # Markdown/HTML/plots per file, an index page for several


def resolve_device(name: str):
    """`--device`'s torch device; on a CPU, Triton rows run under the interpreter (set before its import)."""
    from h3bench.harness.runner import resolve_device as resolve

    try:
        device = resolve(name)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if device.type == "cpu" and "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    return device
