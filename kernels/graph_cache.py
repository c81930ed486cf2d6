"""A no-grad call's launches replayed as one CUDA graph where its tensors sit where they did last time.

Used by timestep_mlp's and norm_modulate's inference paths. At small T a timestep_mlp forward's Python
launches take as long as its kernels or longer, so a loop that calls it is paced by the host;
norm_modulate's per-sample forward at R = 4097 likewise. A CUDA graph replays the same launches for a small
fraction of that host time, with bitwise the same outputs (kernels/notes/gemm.md, "No-grad forward", and
kernels/notes/norm_modulate.md, "Host path", have the H200 figures). A graph reads and writes fixed
addresses, so it stands for a call only when every tensor the call touches is where it was at capture; its
contents may differ (the graph reads them at replay). `GraphCache.run(key, launch)`:
  - key: everything the launches depend on besides the tensors' contents: the caller's launch recipe
    (shapes, strides, dtypes, configs), the device, the current stream, and the address of every tensor
    read or written, the fresh output included (the caching allocator hands a loop the block it freed,
    so a loop's calls repeat their key; a caller that keeps the last output gets another block: a miss);
  - a key with a graph: replayed on the current stream;
  - a key equal to the previous call's (a loop's second call): the launches captured into a new graph
    (`launch` then runs under capture: what it allocates, intermediates and split-K partials, belongs to
    the graph's private pool), which is replayed for this call;
  - otherwise the plain launches. Never under an enclosing capture (the plain launches are then
    captured into the caller's graph), never with launch hooks installed (a profiler's), never on the CPU.
A graph replays on one stream at a time: the stream is part of the key, so two streams get two graphs
(with their own intermediates). At most `capacity` graphs are kept (least recently used dropped); each
holds its intermediates in a private pool of at least one 2 MB segment (the caller bounds what a graph may
hold: timestep_mlp takes graphs only up to 64 rows, under 6 MB of intermediates each). The result is
bitwise the plain launches' (the same kernels on the same values: tested on the GPU,
tests/test_graph_cache.py). The capture is thread-local (`capture_error_mode="thread_local"`): another
thread's CUDA calls during it are not made illegal by it.

On or off per cache: each caller states its default (`GraphCache(on_by_default=...)`, from what its op's
replay was measured to buy), and H3BENCH_GRAPHS=1 / 0 turns every cache on / off.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Callable, Hashable

import torch

from h3bench.kernels.common import fast_launch_allowed


def env_choice() -> bool | None:
    """H3BENCH_GRAPHS: "1" every cache on, "0" every cache off, unset (or empty) each cache's own default."""
    value = os.environ.get("H3BENCH_GRAPHS", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"H3BENCH_GRAPHS must be 0 or 1 (or unset: each op's default), got {value!r}")
    return None if value == "" else value == "1"


class GraphCache:
    def __init__(self, capacity: int = 8, capture: Callable | None = None, on_by_default: bool = False):
        """`capture(launch)` makes a replayable object of `launch`'s launches (default: a torch CUDA graph);
        `on` is H3BENCH_GRAPHS's choice if set, else `on_by_default` (tools and tests set it directly)."""
        choice = env_choice()
        self.on_by_default = on_by_default
        self.on = on_by_default if choice is None else choice
        self.capacity = capacity
        self._capture = capture or capture_cuda_graph
        self._graphs: OrderedDict = OrderedDict()
        self._last: Hashable = None
        self.captures = 0
        self.replays = 0
        self.errors: list[str] = []

    def run(self, key: Hashable, launch: Callable[[], None]) -> None:
        """Run `launch` (the call's launches, writing its output), or a graph of them with the same effect."""
        graph = self._graphs.get(key)
        if graph is None and key == self._last:
            try:
                graph = self._capture(launch)
            except RuntimeError as error:   # e.g. another thread's CUDA work broke the capture: launch plainly
                self.errors.append(str(error))
                self._last = None
                launch()
                return
            self._graphs[key] = graph
            self.captures += 1
            if len(self._graphs) > self.capacity:
                self._graphs.popitem(last=False)
        self._last = key
        if graph is None:
            launch()
            return
        self._graphs.move_to_end(key)
        graph.replay()
        self.replays += 1

    def clear(self) -> None:
        self._graphs.clear()
        self._last = None

    def usable(self, t: torch.Tensor) -> bool:
        """Graphs may stand for this call: on, CUDA, no enclosing capture, no launch hooks."""
        return (self.on and t.is_cuda and fast_launch_allowed()
                and not torch.cuda.is_current_stream_capturing())

    def described(self, device: torch.device) -> str:
        """What a row's `source` says of this path: on or nothing."""
        return "; no-grad calls repeated with their tensors in place replay a CUDA graph" if (
            self.on and device.type == "cuda") else ""


def placed(device_index: int, *tensors: torch.Tensor) -> tuple:
    """A key's placement part: the device, its current stream and every tensor's address, in order."""
    return (device_index, torch._C._cuda_getCurrentRawStream(device_index)) + tuple(t.data_ptr() for t in tensors)


def capture_cuda_graph(launch: Callable[[], None]):
    """`launch`'s launches captured on a side stream into a torch CUDA graph (what `GraphCache` replays)."""
    stream = torch.cuda.current_stream()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(stream)   # the capture reads what the caller's stream has queued for the inputs
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        launch()
    stream.wait_stream(side)
    return graph
