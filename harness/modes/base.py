"""What a global mode is: a process-wide switch (usually aten ops replaced), its environment, and the
check that it really took effect.

A mode patches aten for the whole process, so every mode but `plain` runs in a child process of its own
(harness/runner.py) whose environment gets `ModeSpec.environment` before CUDA or triton start. In that
process `ModeSpec.switch()` imports the mode's library, switches it on and returns an `ActiveMode`, or
raises (the mode is then recorded `{"unavailable": ...}`). Before any row is measured the runner calls
`ActiveMode.check()`, which must raise unless the mode is demonstrably on (for the aten-patching modes:
a named aten op's CUDA kernel really is replaced). `reference_off()` switches the mode off around the
float64 reference for modes with no float64 path, as the RFC does.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import torch


class ModeNotActive(RuntimeError):
    """A mode's switch ran but the mode is not in effect: its rows would measure plain torch."""


@dataclass
class ActiveMode:
    """A switched-on mode. `record` goes into environment.mode_environment.<mode> beside the environment
    variables and library versions; `off` (optional) switches the mode off and `on` back on."""

    check: Callable[[], dict[str, Any]]
    off: Optional[Callable[[], None]] = None
    on: Optional[Callable[[], None]] = None
    record: dict[str, Any] = field(default_factory=dict)

    @contextlib.contextmanager
    def reference_off(self) -> Iterator[None]:
        if self.off is None or self.on is None:
            yield
            return
        self.off()
        try:
            yield
        finally:
            self.on()


@dataclass(frozen=True)
class ModeSpec:
    name: str
    summary: str
    switch: Callable[[], ActiveMode]
    environment: dict[str, str] = field(default_factory=dict)  # set in the child before CUDA starts
    needs: tuple[str, ...] = ()        # distributions whose versions are recorded
    reference_with_mode_off: bool = False
    in_process: bool = False           # plain: nothing to isolate, runs in the parent


# --- checking that aten ops are really replaced -------------------------------------------------------

def dispatch_state(ops: Sequence[str], key: str = "CUDA") -> dict[str, str]:
    """Per aten op, the dispatcher's description of its kernel for `key` (which file registered it).
    A torch.library override changes it; equal before and after means the op was not replaced."""
    state = {}
    for op in ops:
        dump = torch._C._dispatch_dump(op)
        lines = [line for line in dump.splitlines() if line.strip().startswith(f"{key}:")]
        state[op] = "\n".join(lines)
    return state


def replaced_ops(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The ops whose description changed; an op `before` did not look at cannot be judged."""
    return sorted(op for op in after if op in before and after[op] != before[op])


def require_replaced(mode: str, before: dict[str, str], ops: Sequence[str], key: str = "CUDA") -> list[str]:
    """The ops among `ops` whose `key` kernel changed since `before`; ModeNotActive when none did."""
    missing = [op for op in ops if op not in before]
    if missing:
        raise ValueError(f"no state recorded before the switch for {', '.join(missing)}")
    replaced = replaced_ops(before, dispatch_state(ops, key))
    if not replaced:
        raise ModeNotActive(f"mode {mode} is not active: none of {', '.join(ops)} has a new {key} kernel")
    return replaced
