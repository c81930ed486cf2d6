"""Turns on a GPU that several runs share: timing alone, bitwise probes together.

A full run spends most of its time in the bitwise probes (the RFC's three make about 11,500 calls of a
row's fwd+bwd: 7107 rows alone, 2124 sub-batches, 2256 sweep batches, most of them of one to a few rows,
where the host's launch path, not the GPU, sets the pace), and the rest in what must have the GPU to
itself: the bandwidth measurement, the contention probe (it loads the GPU on purpose and compares against
idle) and the rows' latency rounds. Several runs on one GPU (`h3bench run --gpus N --per-gpu K`,
harness/fanout.py) therefore take turns. A probe, and a row's load (which may build, compile or allocate),
holds a shared turn, so the probes of several runs overlap. A measurement holds an exclusive turn, which
waits for the probes in flight to end or to pause at their next step (below) and keeps new ones from
starting until it is done, so it times a GPU on which only its own run works. Between turns a run does
only host work that launches nothing.

The turns are two `flock` locks on files named by H3BENCH_GPU_TURNS (one path a GPU, set by the fan-out
for every job on that GPU): a gate and the turn itself. A shared turn passes the gate (shared) and takes the
turn shared; an exclusive turn closes the gate (exclusive), so no new shared turn starts, then takes the
turn exclusive. Without the variable (one run on its GPU, a CPU run) every turn is free. Nested turns in
one process are the outer turn's (a measurement inside a probe runs in the probe's turn).

The runs share the card's memory too. A run hands what its allocator keeps cached back at the end of each
turn, so the memory is free for the runs that come next; a step that still runs out of memory in a shared
turn runs again in an exclusive one (`shared_else_alone`: the runner's row loads, probes and control), since
the other runs' allocations, not its own, may have filled the card.

A probe's shared turn may last 20 s and more (on an H100 the all-rows probe of final_adaln_out's
torch_compile row took 22 s; a max-autotune row compiles up to its 30 s budget within one), and an exclusive
turn waiting for it keeps every other run's probes from starting meanwhile: the GPU idles but for that
probe. So a probe lets a waiting measurement in between its steps (`let_measurement_in`, which the
runner calls at each step of a probe's progress): it finishes its kernels, hands its turn over and takes a
shared one again once the measurement is done. A compilation inside one call is no step, but a
torch.compile row lets a waiting measurement in before each one starts (adapters/_torch_compile.py).

Every exclusive turn stops the other runs' probes, so the runs' measurements add up one after another: a
run counts its turns, the seconds it held them and the seconds it waited for them (`tally`); `h3bench run`
prints them as it ends (`summary`), and the fan-out shows that line with the job's finish.
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

ENV = "H3BENCH_GPU_TURNS"

_depth = 0  # turns this process holds (nested turns are the outer one's)
_shared_files = None  # (gate, turn) while this process holds a shared turn of its own, for let_measurement_in

# The start of the line with a run's turns (`summary`), for the fan-out to find in the job's output.
TALLY_MARK = "h3bench turns:"


@dataclass
class TurnCount:
    turns: int = 0
    held_s: float = 0.0  # from getting each turn to letting it go, the turns let to measurements left out
    waited_s: float = 0.0  # from asking for each turn to getting it, and for it back after a measurement
    let_in: int = 0  # measurements let in during these turns (shared turns only)
    let_in_waited_s: float = 0.0  # the part of waited_s spent waiting for the turn back after those


@dataclass
class Tally:
    """This process's turns on its shared GPU, by kind (nested turns are their outer turn's)."""
    shared: TurnCount = field(default_factory=TurnCount)
    exclusive: TurnCount = field(default_factory=TurnCount)


_tally = Tally()


def tally() -> Tally:
    """The turns this process has taken so far (all zero where it did not share its GPU)."""
    return _tally


def summary() -> str:
    """One line: `h3bench turns: exclusive N held X s waited Y s; shared N held X s waited Y s, M
    measurement(s) let in`."""
    parts = [f"{kind} {count.turns} held {count.held_s:.1f} s waited {count.waited_s:.1f} s"
             for kind, count in (("exclusive", _tally.exclusive), ("shared", _tally.shared))]
    return f"{TALLY_MARK} " + "; ".join(parts) + f", {_tally.shared.let_in} measurement(s) let in"


def let_in_wait_s() -> float:
    """Seconds this process has waited so far for its shared turns back after letting measurements in:
    a step's duration less the growth of this is the step's own time."""
    return _tally.shared.let_in_waited_s


def let_measurement_in() -> None:
    """Between two steps of a probe in its shared turn: where another run waits for an exclusive turn, let it
    have the GPU now, then take a shared turn again (this waits until the measurement is done). Nothing
    otherwise: no sharing, a nested turn, an exclusive one, or no measurement waiting."""
    if _shared_files is None or _depth != 1:
        return
    gate, turn = _shared_files
    try:
        fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # an exclusive turn holds the gate: it waits for the shared turns
        pass
    else:
        fcntl.flock(gate, fcntl.LOCK_UN)
        return
    _synchronize()  # none of this run's kernels may run in the measurement's turn
    _hand_back_cached_memory()
    fcntl.flock(turn, fcntl.LOCK_UN)
    asked = time.monotonic()
    _take_shared(gate, turn)
    waited = time.monotonic() - asked
    _tally.shared.waited_s += waited
    _tally.shared.let_in_waited_s += waited
    _tally.shared.let_in += 1


def sharing() -> bool:
    """Whether this run shares its GPU with other runs (the fan-out named the GPU's turn files)."""
    return bool(os.environ.get(ENV))


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


def shared_else_alone(step: Callable[[], T], ran_out: Callable[[T], bool] = lambda _result: False) -> T:
    """`step()` in a shared turn. Where it runs out of GPU memory there (it raises torch's
    OutOfMemoryError, or `ran_out` says its result is that failure), once more in an exclusive turn: the
    other runs' allocations may have filled the card, so running out beside them is no verdict on the
    step. By the time the exclusive turn starts their probes have ended and handed their cached memory
    back. Without sharing (or inside a turn already) the first outcome stands."""
    retry = sharing() and not _depth
    try:
        with shared():
            result = step()
    except Exception as exc:
        if not (retry and _out_of_memory(exc)):
            raise
    else:
        if not (retry and ran_out(result)):
            return result
    gc.collect()  # the failed attempt's tensors, before its cached blocks go back
    _hand_back_cached_memory()
    print("h3bench: a step ran out of GPU memory beside other runs on the card; running it again alone",
          file=sys.stderr, flush=True)
    with exclusive():
        return step()


@contextlib.contextmanager
def _turn(exclusive: bool) -> Iterator[None]:
    global _depth, _shared_files
    path = os.environ.get(ENV)
    if not path or _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    count = _tally.exclusive if exclusive else _tally.shared
    asked = time.monotonic()
    with open(f"{path}.gate", "a") as gate, open(path, "a") as turn:
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)  # no new shared turn from here
            fcntl.flock(turn, fcntl.LOCK_EX)  # the shared turns in flight end
        else:
            _take_shared(gate, turn)
        got, let_in_before = time.monotonic(), let_in_wait_s()
        _depth += 1
        if not exclusive:
            _shared_files = (gate, turn)
        try:
            yield
        finally:
            _depth -= 1
            _shared_files = None
            _hand_back_cached_memory()
            fcntl.flock(turn, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
            count.turns += 1
            count.waited_s += got - asked
            count.held_s += time.monotonic() - got - (let_in_wait_s() - let_in_before)


def _take_shared(gate, turn) -> None:
    """A shared turn: past the gate, which waits while an exclusive turn waits or runs, then the turn."""
    fcntl.flock(gate, fcntl.LOCK_SH)
    fcntl.flock(turn, fcntl.LOCK_SH)
    fcntl.flock(gate, fcntl.LOCK_UN)


def _out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError anywhere in the exception's chain (a row's failure wraps its cause)."""
    torch = sys.modules.get("torch")
    seen: set[int] = set()
    current: BaseException | None = exc
    while torch is not None and current is not None and id(current) not in seen:
        if isinstance(current, torch.OutOfMemoryError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _cuda_torch():
    """torch where this process has initialised CUDA, else None. Through sys.modules: this module imports no
    torch (a run that never loaded it has no kernels to wait for and no CUDA memory to give back)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_initialized() else None


def _synchronize() -> None:
    """Wait for this process's kernels."""
    torch = _cuda_torch()
    if torch is not None:
        torch.cuda.synchronize()


def _hand_back_cached_memory() -> None:
    """Free the blocks torch's allocator keeps cached for this process, so that the runs after this turn
    can have them."""
    torch = _cuda_torch()
    if torch is not None:
        torch.cuda.empty_cache()
