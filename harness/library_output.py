"""What a library prints to the process's stderr while it works for a row (Inductor's autotune tables:
every GEMM choice benchmarked, per shape, hundreds of lines a max-autotune row) belongs to the run's log,
not to the console that shows the run's progress and summary.

A run names its log (`kept_in(path)`: the runner uses `<evidence file>.library.log`); code that knows a
library is about to talk starts `divert(label)` and ends it (adapters/_torch_compile.py: from a
compilation's start callback to its end callback), or wraps a block in `diverted(label)`. Without a log
named (a library call from a test, a tool) nothing is diverted. The file is written only if something was
printed, each stretch headed by its label.

Libraries also talk through `logging`: a handler made with `logging.StreamHandler()` keeps the stderr of
its making (torch's loggers: Inductor logs each autotuning choice that fails to compile, with its
traceback, seen on an H100 when a max-autotune row's compile budget stopped one). While a stretch is
diverted, every handler that writes to the stderr being replaced writes to the log too."""
from __future__ import annotations

import contextlib
import io
import logging
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
        self.handlers: list[logging.StreamHandler] = []
        if _log is not None:
            self.saved, sys.stderr = sys.stderr, _Headed(_log, f"--- {label}\n")
            self.handlers = _handlers_writing_to(self.saved)
            for handler in self.handlers:
                handler.stream = sys.stderr

    def end(self) -> None:
        if self.saved is not None:
            for handler in self.handlers:
                handler.stream = self.saved
            sys.stderr, self.saved, self.handlers = self.saved, None, []


def _handlers_writing_to(stream) -> list[logging.StreamHandler]:
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is stream]


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
