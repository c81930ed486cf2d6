"""Modes that need nothing but torch: `plain` and `deterministic`."""
from __future__ import annotations

from typing import Any

import torch

from h3bench.harness.modes.base import ActiveMode, ModeNotActive, ModeSpec


def _plain() -> ActiveMode:
    return ActiveMode(check=lambda: {})


def _deterministic() -> ActiveMode:
    torch.use_deterministic_algorithms(True)

    def check() -> dict[str, Any]:
        if not torch.are_deterministic_algorithms_enabled():
            raise ModeNotActive("torch.use_deterministic_algorithms(True) did not take effect")
        return {"torch.are_deterministic_algorithms_enabled": True}

    return ActiveMode(check=check, record={"switch": "torch.use_deterministic_algorithms(True)"})


PLAIN = ModeSpec(name="plain", summary="torch as installed, nothing switched on", switch=_plain, in_process=True)

DETERMINISTIC = ModeSpec(
    name="deterministic", summary="torch.use_deterministic_algorithms(True): what a user reaches for first",
    switch=_deterministic, environment={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, needs=("torch",))
