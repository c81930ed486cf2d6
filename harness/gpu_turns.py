"""Turns on a GPU that several runs share: timing alone, bitwise probes together.

A full run spends most of its time in the bitwise probes (the RFC's three make about 11,500 calls of a
row's fwd+bwd: 7107 rows alone, 2124 sub-batches, 2256 sweep batches, most of them of one to a few rows,
where the host's launch path, not the GPU, sets the pace), and the rest in what must have the GPU to
itself: the bandwidth measurement, the contention probe (it loads the GPU on purpose and compares against
idle) and the rows' latency rounds. Several runs on one GPU (`h3bench run --gpus N --per-gpu K`,
harness/fanout.py) therefore take turns. A probe, and a row's load (which may build, compile or allocate),
holds a shared turn, so the probes of several runs overlap. A measurement holds an exclusive turn, which
waits for the probes in flight to end and keeps new ones from starting until it is done, so it times a GPU
on which only its own run works. Between turns a run does only host work that launches nothing.

The turns are two `flock` locks on files named by H3BENCH_GPU_TURNS (one path a GPU, set by the fan-out
for every job on that GPU): a gate and the turn itself. A shared turn passes the gate (shared) and takes the
turn shared; an exclusive turn closes the gate (exclusive), so no new shared turn starts, then takes the
turn exclusive. Without the variable (one run on its GPU, a CPU run) every turn is free. Nested turns in
one process are the outer turn's (a measurement inside a probe runs in the probe's turn).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator

ENV = "H3BENCH_GPU_TURNS"

_depth = 0  # turns this process holds (nested turns are the outer one's)


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """A turn other runs' probes may share; none of their measurements runs meanwhile."""
    with _turn(exclusive=False):
        yield


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """The GPU to this run alone: no other run's probe or measurement runs meanwhile."""
    with _turn(exclusive=True):
        yield


@contextlib.contextmanager
def _turn(exclusive: bool) -> Iterator[None]:
    global _depth
    path = os.environ.get(ENV)
    if not path or _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    with open(f"{path}.gate", "a") as gate, open(path, "a") as turn:
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)  # no new shared turn from here
            fcntl.flock(turn, fcntl.LOCK_EX)  # the shared turns in flight end
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)  # waits while an exclusive turn waits or runs
            fcntl.flock(turn, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            fcntl.flock(turn, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
