"""Each global mode but plain in its own process, as `h3bench run` runs modes (harness/children.py): the
mode's variables set before torch starts, its switch and check run in the child (`python -m
h3bench.harness.model_audit`), one part file per mode; a mode whose child fails, writes nothing or cannot
switch on is `unavailable` with the reason."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch

from h3bench.harness import fanout
from h3bench.harness.children import device_slot
from h3bench.harness.model_schema import ModeResult
from h3bench.harness.modes import ModeSpec
from h3bench.harness.schema import SchemaError, UnavailableMode, from_dict, read_json

CHILD = (sys.executable, "-m", "h3bench.harness.model_audit")


def child_argv(spec: str, mode: str, device: torch.device, plan: str, dtype: Optional[str], part: Path) -> tuple:
    return (*CHILD, spec, "--mode", mode, "--device", device.type, "--plan", plan, "--out", str(part),
            *(("--dtype", dtype) if dtype else ()))


def run_children(spec: str, modes: list[ModeSpec], device: torch.device, plan: str, dtype: Optional[str],
                 timeout_s: float) -> dict[str, ModeResult | UnavailableMode]:
    if device.type == "cuda":
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory(prefix="h3bench-model-modes-") as tmp:
        jobs = [fanout.Job(key=f"model/{m.name}", argv=child_argv(spec, m.name, device, plan, dtype,
                                                                  Path(tmp) / f"{m.name}.json"),
                           out=Path(tmp) / f"{m.name}.json", cost_s=1.0, timeout_s=timeout_s,
                           env=dict(m.environment)) for m in modes]
        outcomes = fanout.run_jobs(jobs, [device_slot(device)], retries=0)
        return {m.name: _part(o) for m, o in zip(modes, outcomes)}


def _part(outcome: fanout.Outcome) -> ModeResult | UnavailableMode:
    if not outcome.ok:
        return UnavailableMode(unavailable=f"child process: {outcome.error}")
    try:
        data = read_json(outcome.job.out)
        return from_dict(ModeResult | UnavailableMode, data)
    except (OSError, SchemaError) as exc:
        return UnavailableMode(unavailable=f"child process wrote no valid part file: {exc}")
