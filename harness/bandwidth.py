"""Read bandwidth and write bandwidth of device memory, each measured on its own: the rates the memory
floor prices an op's bytes read and bytes written at (harness/floors.py).

- read: kernels torch offers that read a large buffer and write almost nothing (a sum, a max, row sums);
- write: fills of a large buffer (as fp32 and as bytes).

Each kernel's rate is its best sample of `reps` (per-sample synchronized: CUDA events on a GPU, the wall
clock on a CPU), and the fastest kernel gives the rate: a floor must bound whatever kernel an
implementation runs from below, so it takes the best the device was seen to do, not a typical figure.
On CUDA the buffer is 1 GiB, far past any L2 (50 MB on the H200), so every sample reaches DRAM; on a CPU a
smaller buffer and fewer samples keep a quick run quick.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import torch

from h3bench.harness.timing import SYNCHRONIZED, EventClock, take, timer_for

BYTES_CUDA = 1 << 30
BYTES_CPU = 1 << 26
ROW = 1 << 14  # row sums reduce rows of this many fp32 elements: one fp32 written per 64 KiB read

READ_KERNELS: Mapping[str, Callable[[torch.Tensor], object]] = {
    "sum": lambda buffer: buffer.sum(),
    "amax": lambda buffer: buffer.amax(),
    "row sums": lambda buffer: buffer.view(-1, ROW).sum(dim=1),
}
WRITE_KERNELS: Mapping[str, Callable[[torch.Tensor], object]] = {
    "fill fp32": lambda buffer: buffer.fill_(1.0),
    "fill uint8": lambda buffer: buffer.view(torch.uint8).fill_(1),
}


@dataclass(frozen=True)
class Rate:
    """The fastest kernel's bandwidth in GB/s, the bytes each of its samples moved, and its name."""

    gbps: float
    nbytes: int
    kernel: str


@dataclass(frozen=True)
class Measured:
    read: Rate
    write: Rate
    method: str  # how every kernel was sampled, for the environment block


def best_rate(kernels: Mapping[str, Callable[[torch.Tensor], object]], buffer: torch.Tensor,
              device: torch.device, warmup: int, reps: int, clock: Optional[EventClock] = None) -> Rate:
    """The highest rate any of `kernels` reaches on `buffer`, each kernel's rate from its best sample; the
    bytes are the buffer's (what each kernel reads, or writes; row sums' one fp32 per row is left out).
    `clock` replaces CUDA events (tests)."""
    nbytes = buffer.numel() * buffer.element_size()
    best: Optional[Rate] = None
    for name, kernel in kernels.items():
        def step(kernel=kernel) -> object:
            return kernel(buffer)
        for _ in range(warmup):
            step()
        fastest_us = min(take(step, device, SYNCHRONIZED, reps, clock=clock))
        rate = Rate(gbps=nbytes / (fastest_us * 1e3), nbytes=nbytes, kernel=name)
        if best is None or rate.gbps > best.gbps:
            best = rate
    if best is None:
        raise ValueError("no kernels to measure")
    return best


def measure(device: torch.device, nbytes: Optional[int] = None, warmup: Optional[int] = None,
            reps: Optional[int] = None) -> Measured:
    """Write bandwidth (the fills also initialize the buffer), then read bandwidth over the same buffer."""
    cuda = device.type == "cuda"
    nbytes = nbytes or (BYTES_CUDA if cuda else BYTES_CPU)
    warmup = (3 if cuda else 1) if warmup is None else warmup
    reps = (20 if cuda else 3) if reps is None else reps
    elements = nbytes // 4 // ROW * ROW
    if elements < ROW:
        raise ValueError(f"bandwidth buffer must hold at least {ROW * 4} bytes, got {nbytes}")
    buffer = torch.empty(elements, dtype=torch.float32, device=device)
    write = best_rate(WRITE_KERNELS, buffer, device, warmup, reps)
    read = best_rate(READ_KERNELS, buffer, device, warmup, reps)
    del buffer
    method = (f"each kernel's best of {reps} samples ({timer_for(device)}, each sample synchronized) after "
              f"{warmup} warm-ups over one {elements * 4}-byte buffer, the fastest kernel counting; read: "
              f"{', '.join(READ_KERNELS)} (fp32); write: {', '.join(WRITE_KERNELS)}")
    return Measured(read=read, write=write, method=method)
