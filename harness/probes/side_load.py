"""A side load that keeps the device busy while a row's kernels run: the contention probe's background.

Two kinds, the two ways another workload shares a GPU with a kernel: `memory` (large copies, DRAM
bandwidth) and `compute` (large matmuls, the SMs). On CUDA the load's work goes to a second stream from a
background thread, a few iterations queued ahead, so it runs beside whatever the main stream launches; on
the CPU the thread runs the same kinds of torch work on the CPU's cores. The load counts its iterations and
(begun ones) and says whether it is busy at a given moment (`busy`: on CUDA, work of its stream not finished yet; on the CPU,
an iteration under way), so the probe can record that it really overlapped the row's runs.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Optional

import torch

LOADS = ("memory", "compute")
QUEUED_AHEAD = 4   # CUDA: iterations in flight on the side stream at most
THREAD_PREFIX = "h3bench side load"
BUSY_WAIT_S = 1.0     # how long a run waits for the load to be under way before starting anyway
BUSY_POLL_S = 0.0002


def _work(kind: str, device: torch.device, copy_mib: int, matmul_dim: int) -> Callable[[], None]:
    """One iteration of the load, its tensors allocated once here."""
    if kind == "memory":
        n = copy_mib * (1 << 20) // 4
        src = torch.ones(n, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)
    if kind == "compute":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(matmul_dim, matmul_dim, generator=gen, device=device).to(dtype)
        b = torch.randn(matmul_dim, matmul_dim, generator=gen, device=device).to(dtype)
        c = torch.empty_like(a)
        return lambda: torch.mm(a, b, out=c)
    raise ValueError(f"unknown side load {kind!r}; known: {', '.join(LOADS)}")


def select_device(device: torch.device) -> None:
    """Make `device`'s primary CUDA context current in the calling (new) thread.

    A new thread has no current context until its first CUDA runtime call. torch.cuda.set_device skips
    the runtime call when the index already equals the one torch believes current (0 in a new thread),
    and cuBLAS checks the driver's current context before any runtime call of ours: the compute load's
    first matmul then warned "Attempting to run cuBLAS, but there was no current CUDA context" and fell
    back to setting the primary context itself. A stream query is a runtime call on this device, which
    binds its primary context to the thread before the first cuBLAS call."""
    torch.cuda.set_device(device)
    torch.cuda.current_stream(device).query()


def indexed(device: torch.device) -> torch.device:
    """`device` with its index (a bare "cuda" names the caller's current device, which a new thread does
    not share): resolved in the thread that builds the load."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class SideLoad:
    """`with SideLoad(kind, device, copy_mib, matmul_dim) as load:` the load runs in a background thread
    until the block ends (it has begun its first iteration when the block starts)."""

    def __init__(self, kind: str, device: torch.device, copy_mib: int, matmul_dim: int):
        self.kind, self.device = kind, indexed(device)
        self.step = _work(kind, device, copy_mib, matmul_dim)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.iterations = 0
        self._in_iteration = False
        self._stop = threading.Event()
        self._started = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, name=f"{THREAD_PREFIX}: {kind}", daemon=True)

    def __enter__(self) -> "SideLoad":
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the load's tensors are ready
        self._thread.start()
        self._started.wait()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.stream is not None:
            self.stream.synchronize()
        if self._error is not None and exc[0] is None:
            raise RuntimeError(f"side load {self.kind!r} failed: {self._error}") from self._error

    def busy(self) -> bool:
        """Whether the load's work is under way right now."""
        if self.stream is not None:
            return not self.stream.query()
        return self._in_iteration

    def wait_busy(self, timeout_s: float = BUSY_WAIT_S) -> bool:
        """Wait (releasing the GIL) until the load is under way; whether it is. A run that synchronizes the
        device drains the side stream's queue with its own work, and the thread needs a moment to queue
        more: without this wait the row's next run can start on an idle device, which a GPU check of our
        Triton row showed (H100: 0 of 5 runs found the load busy)."""
        deadline = time.monotonic() + timeout_s
        while not self.busy():
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(BUSY_POLL_S)
        return True

    def _loop(self) -> None:
        try:
            with torch.no_grad():
                if self.stream is None:
                    self._cpu_loop()
                else:
                    self._cuda_loop()
        except BaseException as exc:  # reported by __exit__: a harness failure, not the row's
            self._error = exc
            self._started.set()

    def _cpu_loop(self) -> None:
        while not self._stop.is_set():
            self._in_iteration = True
            self.iterations += 1
            self._started.set()
            self.step()
            self._in_iteration = False

    def _cuda_loop(self) -> None:
        pending: collections.deque = collections.deque()
        select_device(self.device)
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            while not self._stop.is_set():
                self.step()
                done = torch.cuda.Event()
                done.record(self.stream)
                pending.append(done)
                self.iterations += 1
                self._started.set()
                while len(pending) > QUEUED_AHEAD:
                    pending.popleft().synchronize()  # waits without the GIL: the main thread runs on

