"""Which probe plan a run takes, and why: `--quick` or `--full`, else the plan `--config`'s file sets
(`quick = true` or `false`), else the device's: the quick plan on a CPU, the full plan on CUDA (on a CPU the
full plan's Triton rows run for about an hour under the interpreter). The run's header line says which."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from h3bench.harness.commands import BadInput


@dataclass(frozen=True)
class Plan:
    quick: bool
    source: str   # where the choice came from, as the header says it: "--full", "the CPU default; ..."

    @property
    def name(self) -> str:
        return "quick" if self.quick else "full"

    def describe(self) -> str:
        """`plan quick (the CPU default; --full for the full plan)`."""
        return f"plan {self.name} ({self.source})"


def choose_plan(quick: bool, full: bool, config: Optional[Path], device_type: str) -> Plan:
    """The plan of a run given `--quick`, `--full`, `--config` and the device ("cpu" or "cuda"); a flag that
    contradicts the plan the file sets is bad input."""
    from h3bench.harness.config import PLAN_KEY, ConfigError, file_plan

    try:
        in_file = file_plan(config) if config is not None else None
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    flag = "--quick" if quick else "--full" if full else None
    if flag is not None:
        if in_file is not None and in_file != quick:
            raise BadInput(f"{flag}: {config} sets {PLAN_KEY} = {str(in_file).lower()} (the "
                           f"{'quick' if in_file else 'full'} plan); give the plan once, in the file or as a flag")
        return Plan(quick, flag)
    if in_file is not None:
        return Plan(in_file, f"{config}: {PLAN_KEY} = {str(in_file).lower()}")
    if device_type == "cpu":
        return Plan(True, "the CPU default; --full for the full plan")
    return Plan(False, f"the {device_type.upper()} default; --quick for the quick plan")
