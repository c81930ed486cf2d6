"""What a run is asked to do (`RunRequest`) and whom it tells how far it got (`Observer`).

The runner (harness/runner.py) measures a request in this process; the child machinery (harness/children.py)
turns the same request into a mode's child process. Both read it from here, so neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

import torch

from h3bench.harness import control
from h3bench.harness.adapter import Adapter
from h3bench.harness.config import RunConfig
from h3bench.harness.schema import RowResult, UnavailableRow


class Observer(Protocol):
    """Progress sink: the CLI shows a rich progress bar; tests and --quiet pass a silent one."""

    def row_started(self, mode: str, name: str, totals: dict[str, int]) -> None: ...
    def probe_started(self, probe: str) -> None: ...
    def advance(self, n: int) -> None: ...
    def row_finished(self, mode: str, name: str, row: RowResult | UnavailableRow) -> None: ...
    def phase_started(self, mode: str, label: str, total: int) -> None: ...
    def phase_finished(self) -> None: ...


class SilentObserver:
    def row_started(self, mode, name, totals): pass
    def probe_started(self, probe): pass
    def advance(self, n): pass
    def row_finished(self, mode, name, row): pass
    def phase_started(self, mode, label, total): pass
    def phase_finished(self): pass


@dataclass
class RunRequest:
    config: RunConfig
    device: torch.device
    adapters: list[Adapter]
    modes: list[str]
    out: Optional[Path]
    command: str = ""
    measure_bandwidth: bool = True
    # The CLI arguments that make a child process run the same rows and plan (everything but the mode
    # and the output), and how long a mode's child may take.
    child_args: tuple[str, ...] = ()
    mode_timeout_s: Optional[float] = None
    in_process: bool = False  # this process is a mode's child: run its one mode here
    work_dir: Optional[Path] = None  # where children's part files go (default: beside `out`)
    control: str = control.HERE  # where the negative control runs: control.HERE, SKIP or ELSEWHERE
    control_only: bool = False  # measure the control alone (a fan-out's control job), no rows
    # The op's diffusers composition the control plants its fault in, from the caller's adapter registry
    # (harness/ does not import adapters/); None: the op has none, and the control is recorded as skipped.
    control_adapter: Optional[Adapter] = None
    # The command that starts the `h3bench` program in a child process (a mode's child, a fan-out job),
    # e.g. (sys.executable, "-m", "h3bench.cli"): the program's composition root, named by its caller.
    child_program: tuple[str, ...] = ()
