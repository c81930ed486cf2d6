"""Peak memory of one step: the most the step had allocated at once beyond what was allocated before it.

As TritonBench and Liger report it: `torch.cuda.max_memory_allocated` over the step, after
`torch.cuda.reset_peak_memory_stats`, minus `torch.cuda.memory_allocated` before the step. What exists
before the step (the inputs, the leaves, the upstream gradients, other rows' tensors) is not the step's;
what the step allocates and frees again (intermediates, outputs it drops, gradients it writes) is. The
figure counts the caching allocator's blocks in use, not its reserved segments. A block is its request
rounded up to 512 bytes, or a cached block up to 1 MiB larger (the allocator splits a large cached block
only where more than 1 MiB would remain), so the figure may exceed what the step asked for by up to 1 MiB
per live allocation, depending on what earlier steps left cached.

The readers are parameters (`Readers`), so the arithmetic runs on a CPU with fakes; `cuda_readers` are
torch's for one device. The CPU has no such counters: there the figure is absent, never zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class Readers:
    """The allocator's counters: bytes allocated now, the most allocated since the last `reset_peak`, and
    `synchronize` (the step's queued work done, so what it allocates and frees has happened)."""

    allocated: Callable[[], int]
    peak: Callable[[], int]
    reset_peak: Callable[[], None]
    synchronize: Callable[[], None]


def cuda_readers(device: torch.device) -> Readers:
    return Readers(allocated=lambda: torch.cuda.memory_allocated(device),
                   peak=lambda: torch.cuda.max_memory_allocated(device),
                   reset_peak=lambda: torch.cuda.reset_peak_memory_stats(device),
                   synchronize=lambda: torch.cuda.synchronize(device))


def readers_for(device: torch.device) -> Optional[Readers]:
    """The counters of `device`; None where there are none (the CPU)."""
    return cuda_readers(device) if device.type == "cuda" else None


def peak_bytes(step: Callable[[], object], readers: Readers, setup: Optional[Callable[[], object]] = None) -> int:
    """Bytes the step had allocated at its peak beyond those allocated before it. `setup` runs first, as
    before a timed sample (it may free what the previous step left, e.g. leaves' gradients)."""
    if setup is not None:
        setup()
    readers.synchronize()
    before = readers.allocated()
    readers.reset_peak()
    step()
    readers.synchronize()
    return readers.peak() - before
