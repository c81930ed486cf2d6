"""Global modes a run can be made under. Each mode switches its setting on, checks that it really is
on (a mode that silently failed to apply would make its rows lie), and records what it set."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, ContextManager, Iterator

import torch


@contextlib.contextmanager
def plain() -> Iterator[dict[str, Any]]:
    yield {}


@contextlib.contextmanager
def deterministic() -> Iterator[dict[str, Any]]:
    """torch.use_deterministic_algorithms(True): what a user reaches for first to get repeatability."""
    before = torch.are_deterministic_algorithms_enabled()
    previous_cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.use_deterministic_algorithms(True)
    try:
        if not torch.are_deterministic_algorithms_enabled():
            raise RuntimeError("torch.use_deterministic_algorithms(True) did not take effect")
        yield {"torch.use_deterministic_algorithms": True,
               "CUBLAS_WORKSPACE_CONFIG": os.environ["CUBLAS_WORKSPACE_CONFIG"]}
    finally:
        torch.use_deterministic_algorithms(before)
        if previous_cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = previous_cublas


MODES: dict[str, Callable[[], ContextManager[dict[str, Any]]]] = {
    "plain": plain,
    "deterministic": deterministic,
}


def get_mode(name: str) -> Callable[[], ContextManager[dict[str, Any]]]:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; known modes: {', '.join(MODES)}") from None
