"""Latency sampling: CUDA events on a GPU, the wall clock on a CPU; medians, never means.

`setup` runs before each sample, outside the timed region (for CUDA events: before the start event
is recorded), so work that must not count, such as fresh leaves, can be prepared per sample.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

CUDA_EVENTS = "cuda_events"
WALL_CLOCK = "wall_clock"


@dataclass(frozen=True)
class Samples:
    timer: str
    us: list[float]

    @property
    def median_us(self) -> float:
        return median(self.us)


def median(values: list[float]) -> float:
    if not values:
        raise ValueError("median of no samples")
    return float(statistics.median(values))


def timer_for(device: torch.device) -> str:
    return CUDA_EVENTS if device.type == "cuda" else WALL_CLOCK


def sample(step: Callable[[], object], device: torch.device, warmup: int, reps: int,
           setup: Optional[Callable[[], object]] = None) -> Samples:
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    for _ in range(warmup):
        if setup is not None:
            setup()
        step()
    if device.type == "cuda":
        return _sample_cuda(step, device, reps, setup)
    return _sample_wall(step, reps, setup)


def _sample_cuda(step, device, reps, setup) -> Samples:
    torch.cuda.synchronize(device)
    pairs = []
    for _ in range(reps):
        if setup is not None:
            setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize(device)
    return Samples(timer=CUDA_EVENTS, us=[s.elapsed_time(e) * 1e3 for s, e in pairs])


def _sample_wall(step, reps, setup) -> Samples:
    us = []
    for _ in range(reps):
        if setup is not None:
            setup()
        start = time.perf_counter()
        step()
        us.append((time.perf_counter() - start) * 1e6)
    return Samples(timer=WALL_CLOCK, us=us)
