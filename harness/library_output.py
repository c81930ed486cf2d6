"""What a library prints to the process's stderr while it works for a row (Inductor's autotune tables:
every GEMM choice benchmarked, per shape, hundreds of lines a max-autotune row) belongs to the run's log,
not to the console that shows the run's progress and summary.

A run names its log (`kept_in(path)`: the runner uses `<evidence file>.library.log`); code that knows a
library is about to talk starts `divert(label)` and ends it (adapters/_torch_compile.py: from a
compilation's start callback to its end callback), or wraps a block in `diverted(label)`. Without a log
named (a library call from a test, a tool) nothing is diverted. The file is written only if something was
printed, each stretch headed by its label."""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from typing import Iterator, Optional

_log: Optional[io.StringIO] = None


@contextlib.contextmanager
def kept_in(path: Optional[Path]) -> Iterator[None]:
    """Divert library output to `path` (None: nowhere, as without a log) for the block."""
    global _log
    if path is None:
        yield
        return
    previous, _log = _log, io.StringIO()
    try:
        yield
    finally:
        text, _log = _log.getvalue(), previous
        if text:
            Path(path).write_text(text)


class Diversion:
    """sys.stderr replaced by the log until `end()`; started and ended by callbacks that come in pairs
    (a compilation's start and end), so it is an object rather than a `with` block."""

    def __init__(self, label: str):
        self.saved = None
        if _log is not None:
            self.saved, sys.stderr = sys.stderr, _Headed(_log, f"--- {label}\n")

    def end(self) -> None:
        if self.saved is not None:
            sys.stderr, self.saved = self.saved, None


class _Headed:
    """The log as a stream that writes its stretch's label before the first text of the stretch: a
    compilation that printed nothing leaves no line."""

    def __init__(self, log: io.StringIO, label: str):
        self.log, self.label = log, label

    def write(self, text: str) -> int:
        if text and self.label:
            self.log.write(self.label)
            self.label = ""
        return self.log.write(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def divert(label: str) -> Diversion:
    """Start diverting stderr to the run's log (a no-op without one); call `.end()` to stop."""
    return Diversion(label)


@contextlib.contextmanager
def diverted(label: str) -> Iterator[None]:
    diversion = divert(label)
    try:
        yield
    finally:
        diversion.end()
