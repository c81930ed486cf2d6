"""harness/peak_memory.py: a step's peak is what it allocated at its peak beyond what was allocated before
it, read from fake counters on the CPU and from torch's on a GPU."""
from __future__ import annotations

import torch

from h3bench.harness import peak_memory
from h3bench.harness.peak_memory import Readers, peak_bytes

from tests.helpers import needs_cuda


class FakeAllocator:
    """Counters as the CUDA caching allocator keeps them: bytes allocated now, and the most since the last
    reset (a reset sets it to what is allocated now)."""

    def __init__(self, allocated: int = 0):
        self.allocated = allocated
        self.most = allocated
        self.log: list[str] = []

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.most = max(self.most, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def readers(self) -> Readers:
        def reset() -> None:
            self.log.append("reset")
            self.most = self.allocated

        def sync() -> None:
            self.log.append("sync")
        return Readers(allocated=lambda: self.allocated, peak=lambda: self.most, reset_peak=reset,
                       synchronize=sync)


def test_peak_excludes_what_was_allocated_before_and_keeps_what_was_freed_during():
    memory = FakeAllocator(allocated=10_000)   # inputs, leaves, upstream gradients
    memory.alloc(50_000)                       # an earlier step's peak: not this step's
    memory.free(50_000)

    def step() -> None:
        memory.log.append("step")
        memory.alloc(300)    # output
        memory.alloc(700)    # intermediate
        memory.free(700)
        memory.alloc(200)    # a second intermediate, after the first was freed
        memory.free(200)
        memory.free(300)     # the output dropped

    assert peak_bytes(step, memory.readers()) == 1000
    assert memory.log == ["sync", "reset", "step", "sync"]


def test_peak_counts_what_the_step_keeps_and_runs_setup_first():
    memory = FakeAllocator(allocated=4096)

    def setup() -> None:   # frees the previous step's gradients, as the net fwd+bwd's setup does
        memory.log.append("setup")
        memory.free(1024)

    def step() -> None:
        memory.alloc(1024)   # the gradients, kept after the step

    assert peak_bytes(step, memory.readers(), setup) == 1024
    assert memory.log[:2] == ["setup", "sync"]


def test_a_step_that_allocates_nothing_peaks_at_zero():
    assert peak_bytes(lambda: None, FakeAllocator(allocated=123).readers()) == 0


def test_no_counters_on_a_cpu():
    assert peak_memory.readers_for(torch.device("cpu")) is None


@needs_cuda("torch's memory counters need a CUDA device")
def test_cuda_peak_of_a_known_allocation():
    device = torch.device("cuda")
    kept = torch.ones(1 << 20, device=device)   # allocated before: not the step's
    nbytes = 3 << 20

    def step() -> None:
        torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)

    found = peak_bytes(step, peak_memory.cuda_readers(device))
    # the allocator counts the block it hands out: a cached block is split only where more than 1 MiB
    # would remain, so the 3 MiB step may hold a 4 MiB block (seen under pytest-xdist on an H100)
    assert nbytes <= found <= nbytes + (1 << 20), found
    del kept
