"""One mode measured in this process: switched on and checked (as harness/runner.py's measure_mode), then
the model built and checked; a mode that cannot switch on is unavailable with the reason."""
from __future__ import annotations

from typing import Optional

import torch

from h3bench.harness.execute import describe_exception
from h3bench.harness.model_audit.audit import check
from h3bench.harness.model_audit.factory import build
from h3bench.harness.model_schema import ModeResult
from h3bench.harness.modes import get_mode
from h3bench.harness.schema import UnavailableMode


def measure(spec: str, mode: str, device: torch.device, plan: str,
            dtype: Optional[torch.dtype]) -> ModeResult | UnavailableMode:
    try:
        get_mode(mode).switch().check()
    except Exception as exc:  # the mode's library did not import or did not switch on
        return UnavailableMode(unavailable=describe_exception(exc))
    return check(build(spec, device, dtype), plan)
