"""Latency sampling: CUDA events on a GPU, the wall clock on a CPU; medians and percentiles.

Two ways to take a sample (both recorded in every evidence file, `environment.timing` says which key
holds which):

- synchronized (the prior art's method, the `*_us` keys): setup; record start; run the step; record end;
  synchronize; next sample. Each sample starts from an idle GPU, so a call's host cost (argument checks,
  launches, autograd) is in the figure whenever it exceeds the GPU work.
- stream (the `*_stream_us` keys): samples back to back, one synchronize per block. When the host keeps
  ahead of the GPU this is the GPU time a training step sees; when it cannot, the host cost shows anyway.

Rows are timed interleaved (`interleave`): every row is warmed up, then in each round every row takes a
block of samples, the rows' order rotating from round to round. A slow drift of the machine (clocks,
other tenants, a VM's host) then lands on every row alike instead of on whichever row happened to be
timed during it. Each figure is timed `repeats` times (rounds of repeat 0 first, then repeat 1, ...), so
the two medians of one figure show how far the machine drifted between them.

`setup` runs before each sample, outside the timed region, so work that must not count (fresh leaves,
cleared gradients) can be prepared per sample.

L2 flush (`L2Flush`, off by default as in the prior art): before each synchronized sample, after its setup
and outside the timed region, a 256 MiB buffer is zeroed (triton.testing.do_bench's and TritonBench's cache
clear), so the sample starts with none of its operands in the GPU's L2 (on a CPU: the host's caches). The
synchronize before the start event waits for the flush, so its own time is in no sample. The stream method
cannot flush per sample: its samples follow each other with no gap to put the flush in without stalling
the queue, which is the one thing that method measures; `take` refuses the combination.

CUDA graph (`capture_cuda_graph`): the step warmed up on a side stream, then captured once into a
torch.cuda.CUDAGraph; the timed step is the graph's replay, sampled per-sample synchronized like the
prior art's figure. The replay launches the captured kernels with one host call, so the figure is the
step's device time with almost none of its host cost (argument checks, launches, autograd's bookkeeping).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

import torch

CUDA_EVENTS = "cuda_events"
WALL_CLOCK = "wall_clock"
SYNCHRONIZED = "synchronized"
STREAM = "stream"
METHODS = (SYNCHRONIZED, STREAM)
GRAPH = "graph"  # a captured step's replay, sampled as SYNCHRONIZED

Step = Callable[[], object]
FLUSH_BYTES = 256 * 1024 * 1024  # triton.testing.do_bench's cache size: several times any GPU's L2
GRAPH_WARMUP = 3  # side-stream calls before capture, as PyTorch's CUDA graph documentation does


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no samples")
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) with linear interpolation between order statistics, as
    numpy's default: rank q/100 * (n - 1) of the sorted values."""
    if not values:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def timer_for(device: torch.device) -> str:
    return CUDA_EVENTS if device.type == "cuda" else WALL_CLOCK


class EventClock(Protocol):
    """Device-side timestamps: `event()` makes an event whose `record()` marks the point in the device's
    queue and `elapsed_ms(other)` gives the device time between two recorded events; `synchronize()`
    waits until the device is idle. CUDA events here; a simulated device in the tests."""

    def event(self): ...
    def synchronize(self) -> None: ...


class CudaClock:
    def __init__(self, device: torch.device):
        self.device = device

    def event(self):
        return _CudaEvent()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class _CudaEvent:
    __slots__ = ("event",)

    def __init__(self):
        self.event = torch.cuda.Event(enable_timing=True)

    def record(self) -> None:
        self.event.record()

    def elapsed_ms(self, end: "_CudaEvent") -> float:
        return self.event.elapsed_time(end.event)


class L2Flush:
    """Zeroes a buffer of `nbytes` on `device` when called: the cache flush between samples."""

    def __init__(self, device: torch.device, nbytes: int = FLUSH_BYTES):
        self.nbytes = nbytes
        self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def take(step: Step, device: torch.device, method: str, count: int,
         setup: Optional[Callable[[], object]] = None, clock: Optional[EventClock] = None,
         flush: Optional[Callable[[], object]] = None) -> list[float]:
    """`count` samples of `step` in microseconds, by `method` (see the module docstring). On a CPU both
    methods are the wall clock around the step; `clock` replaces CUDA events (tests). `flush` runs before
    each synchronized sample, after `setup`, outside the timed region."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if method not in METHODS:
        raise ValueError(f"unknown sampling method {method!r}; known: {METHODS}")
    if flush is not None and method == STREAM:
        raise ValueError("back-to-back samples cannot be flushed one by one: flush applies to synchronized "
                         "samples only")
    if clock is None and device.type != "cuda":
        return _take_wall(step, count, setup, flush)
    clock = clock or CudaClock(device)
    if method == SYNCHRONIZED:
        return _take_synchronized(step, clock, count, setup, flush)
    return _take_stream(step, clock, count, setup)


def _take_synchronized(step, clock: EventClock, count, setup, flush=None) -> list[float]:
    out = []
    for _ in range(count):
        if setup is not None:
            setup()
        if flush is not None:
            flush()
        start, end = clock.event(), clock.event()
        clock.synchronize()  # each sample starts from an idle device
        start.record()
        step()
        end.record()
        clock.synchronize()
        out.append(start.elapsed_ms(end) * 1e3)
    return out


def _take_stream(step, clock: EventClock, count, setup) -> list[float]:
    clock.synchronize()
    pairs = []
    for _ in range(count):
        if setup is not None:
            setup()
        start, end = clock.event(), clock.event()
        start.record()
        step()
        end.record()
        pairs.append((start, end))
    clock.synchronize()
    return [s.elapsed_ms(e) * 1e3 for s, e in pairs]


def _take_wall(step, count, setup, flush=None) -> list[float]:
    # On a CPU there is no queue to run ahead: both methods are the wall clock around the step.
    out = []
    for _ in range(count):
        if setup is not None:
            setup()
        if flush is not None:
            flush()
        start = time.perf_counter()
        step()
        out.append((time.perf_counter() - start) * 1e6)
    return out


@dataclass
class Subject:
    """One row's figure to time: `step` is the timed call, `setup` prepares each sample."""

    key: str
    step: Step
    setup: Optional[Callable[[], object]] = None


@dataclass
class Timed:
    """A subject's samples per repeat, or the exception that stopped it."""

    samples: list[list[float]] = field(default_factory=list)
    error: Optional[BaseException] = None


def rounds_for(reps: int, block: int) -> int:
    return max(1, math.ceil(reps / max(1, block)))


def interleave(subjects: Sequence[Subject], device: torch.device, method: str, warmup: int, reps: int,
               repeats: int, block: int, on_error: type[BaseException] | tuple[type[BaseException], ...] = Exception,
               progress: Callable[[int], None] = lambda n: None,
               clock: Optional[EventClock] = None, flush: Optional[Callable[[], object]] = None) -> dict[str, Timed]:
    """Time every subject `repeats` times, `reps` samples each (rounded up to whole blocks), interleaved.

    A subject whose step raises `on_error` is dropped with the error kept; the others go on. `flush` (the
    L2 flush) runs before every timed sample, never in the warm-up.
    """
    if len({s.key for s in subjects}) != len(subjects):
        raise ValueError("subject keys must be unique")
    found = {s.key: Timed(samples=[[] for _ in range(repeats)]) for s in subjects}
    live = list(subjects)

    def attempt(subject: Subject, action: Callable[[], object]) -> None:
        try:
            action()
        except on_error as exc:
            found[subject.key].error = exc
            live.remove(subject)

    def warm(subject: Subject) -> None:
        for _ in range(warmup):
            if subject.setup is not None:
                subject.setup()
            subject.step()

    for subject in list(live):
        attempt(subject, lambda s=subject: warm(s))
    rounds = rounds_for(reps, block)
    for repeat in range(repeats):
        for round_no in range(rounds):
            count = min(block, reps - round_no * block)
            order = live[round_no % len(live):] + live[:round_no % len(live)] if live else []
            for subject in order:
                attempt(subject, lambda s=subject: found[s.key].samples[repeat].extend(
                    take(s.step, device, method, count, s.setup, clock, flush)))
            progress(1)
    return found


GraphCapture = Callable[[Step, Optional[Callable[[], object]]], Step]


def capture_cuda_graph(step: Step, setup: Optional[Callable[[], object]] = None) -> Step:
    """`step` captured once into a CUDA graph; returns the graph's replay (the step to time).

    As PyTorch's documentation requires: warmed up on a side stream first (lazy initialisation, autotuning
    and caches happen outside the capture), `setup` before each warm-up call and once before the capture,
    so the capture starts from the state every eager sample starts from. Whatever the step allocates
    under capture (outputs, intermediates, a leaf's .grad when it was None) comes from the graph's
    private memory pool and stays there: each replay writes the same addresses. A step that synchronizes,
    reads a value to the host (.item()), copies from the CPU or otherwise does what a capture forbids
    raises here (the error of its own call, or the capture's)."""
    current = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            if setup is not None:
                setup()
            step()
    current.wait_stream(side)
    if setup is not None:
        setup()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return Replay(graph, step, setup)


class Replay:
    """A captured step's replay. It holds the step and its setup as well as the graph: the graph reads and
    writes the addresses the step's tensors had at capture (a figure's leaves and upstream gradients live
    only in the step's closure), so those tensors must live as long as the graph is replayed. Returning
    `graph.replay` alone freed them as soon as the capture returned; the next capture's
    `torch.cuda.graph` empties the allocator's cache, the freed blocks went back to the driver, and the
    earlier row's replays read unmapped memory: "an illegal memory access" (the fwd_bwd_net figure, whose
    leaves and upstream gradients are made outside the step, of any op with several rows)."""

    __slots__ = ("graph", "step", "setup")

    def __init__(self, graph, step: Step, setup: Optional[Callable[[], object]]):
        self.graph, self.step, self.setup = graph, step, setup

    def __call__(self) -> None:
        self.graph.replay()


def graph_capture_for(device: torch.device) -> Optional[GraphCapture]:
    """How a step is captured on `device`; None where there are no CUDA graphs."""
    return capture_cuda_graph if device.type == "cuda" else None


@dataclass(frozen=True)
class SpreadStats:
    p10: float
    p50: float
    p90: float
    n: int


def spread_of(values: Sequence[float]) -> SpreadStats:
    return SpreadStats(p10=percentile(values, 10), p50=percentile(values, 50), p90=percentile(values, 90),
                       n=len(values))
