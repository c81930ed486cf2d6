"""Triton's interpreter with a launch's programs run at once, in threads, or one after another in reverse
grid order: for kernels whose programs depend on each other, which the interpreter's own loop, one program
after another in grid order, cannot exercise (a program that waits for a later one would wait forever; a
last-arriving program is always the grid's last, as in the GEMMs' split-K reduction).

`concurrent_programs(workers)` patches `triton.runtime.interpreter` for the duration of a `with` block:

* a launch's programs are taken in grid order (`reverse`: the last first) by `workers` threads, each
  running one program to its end before taking the next, as a GPU fills its free slots: with fewer
  workers than programs, a program that waits for one not yet started holds its worker meanwhile (so
  `workers` plays the programs that fit on the GPU at once, and a kernel that needs more of them resident
  than that hangs here as it would there);
* each thread's `tl.program_id` is its own (the builder's grid index is thread-local);
* every atomic lets the other threads run after it (a poll is an atomic: `tl.atomic_add(p, 0)`), and raises
  `ProgramsHung` once the block's deadline has passed, so a hang ends the launch instead of the test run.

What it checks and what it does not: each of the interpreter's loads, stores and atomics is one numpy call
under the GIL, so memory here is sequentially consistent and the acquire / release semantics of the
kernel's atomics and `.cg` loads are not exercised (the GPU tests are for that). What it does exercise is
the protocol in the kernel's own source: its counters, which program adds which partials and in what order,
whether every wait ends with a given number of programs resident, and the values that result.

Written against triton 3.9.0's interpreter (`GridExecutor.__call__`); `require()` skips with the reason
where its parts are missing.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import time
from dataclasses import dataclass

import pytest

# at import, not in a test: importing kernels.common under the interpreter installs its fixed-order tl.dot
# (kernels/interpreted_dot.py), which conftest would count as a change left by the first test that did it
from h3bench.kernels.common import interpreter_active

_PARTS = ("GridExecutor", "InterpreterBuilder", "interpreter_builder", "_patch_lang", "_implicit_cvt", "_ir")


class ProgramsHung(RuntimeError):
    """Programs of a launch were still running (waiting) when the deadline passed."""


def require():
    """triton's interpreter module, or pytest.skip naming what is missing."""
    if not interpreter_active():
        pytest.skip("concurrent programs are an interpreter feature (TRITON_INTERPRET=1, the CPU tests)")
    from triton.runtime import interpreter
    missing = [name for name in _PARTS if not hasattr(interpreter, name)]
    if missing or not hasattr(interpreter.InterpreterBuilder, "create_atomic_rmw"):
        pytest.skip(f"this triton's interpreter lacks {missing or ['create_atomic_rmw']}: concurrent programs "
                    f"are written against triton 3.9.0's")
    return interpreter


@dataclass
class Launch:
    """One launch's record: the kernel, its programs, how many began and ended (a hang: some begun, none
    ending), and its looks at a count (atomic adds of 0: polls included)."""
    kernel: str
    programs: int
    begun: int = 0
    ended_well: int = 0
    looks: int = 0


class _Run:
    """One `with` block's settings and record: every launch in order, the most programs running at once."""

    def __init__(self, workers: int, deadline: float, reverse: bool = False):
        self.workers = workers
        self.deadline = deadline
        self.reverse = reverse
        self.launches: list[Launch] = []
        self.most_running = 0
        self._running = 0
        self._lock = threading.Lock()

    def started(self) -> None:
        with self._lock:
            self.launches[-1].begun += 1
            self._running += 1
            self.most_running = max(self.most_running, self._running)

    def ended(self, well: bool) -> None:
        with self._lock:
            self._running -= 1
            self.launches[-1].ended_well += well

    def looked(self) -> None:
        with self._lock:
            self.launches[-1].looks += 1

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise ProgramsHung("programs still running at the deadline (a wait that never ends?)")


@contextlib.contextmanager
def concurrent_programs(workers: int, timeout_s: float = 120.0, reverse: bool = False):
    """Run every interpreted launch inside the block with `workers` programs at a time (module docstring),
    taken in grid order or (`reverse`) the other way round (a GPU promises neither).
    Yields the block's `_Run` (its record: `launches`, a `Launch` each, and `most_running`)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    I = require()
    run = _Run(workers, time.monotonic() + timeout_s, reverse)
    local = threading.local()
    builder_type = I.InterpreterBuilder
    saved = {name: builder_type.__dict__.get(name) for name in ("grid_idx", "create_atomic_rmw", "create_atomic_cas")}
    saved_call = I.GridExecutor.__call__

    def atomic(original, add=None):
        def patched(self, *args, **kwargs):
            run.check()
            if add is not None and args[0] == add and not args[2].data.any():
                run.looked()   # an add of 0: a look at a count
            out = original(self, *args, **kwargs)
            time.sleep(0)   # let the other programs run: a poll that kept the GIL would starve them
            return out
        return patched

    def call(self, *args_dev, **kwargs):
        # triton 3.9.0's GridExecutor.__call__ with its grid loop replaced by the workers
        argspec = inspect.getfullargspec(self.fn)
        kwargs = {k: v for k, v in kwargs.items() if k in argspec.args or k in argspec.kwonlyargs}
        args_hst, kwargs_hst = self._init_args_hst(args_dev, kwargs)
        for hook in self.pre_run_hooks:
            hook(*args_hst, **kwargs_hst)
        patch_scope = I._patch_lang(self.fn)
        try:
            args = inspect.getcallargs(self.fn, *args_hst, **kwargs_hst)
            args = {name: arg if name in self.constexprs else I._implicit_cvt(arg) for name, arg in args.items()}
            grid = self.grid(args) if callable(self.grid) else self.grid
            grid = tuple(grid) + (1,) * (3 - len(grid))
            I.interpreter_builder.set_grid_dim(*grid)
            run.launches.append(Launch(getattr(self.fn, "__name__", "?"), grid[0] * grid[1] * grid[2]))
            _run_programs(self.fn, args, grid, run, I.interpreter_builder)
        finally:
            patch_scope.restore()
        self._restore_args_dev(args_dev, args_hst, kwargs, kwargs_hst)

    builder_type.grid_idx = property(lambda self: getattr(local, "grid_idx", None),
                                     lambda self, value: setattr(local, "grid_idx", value))
    builder_type.create_atomic_rmw = atomic(builder_type.create_atomic_rmw, add=I._ir.ATOMIC_OP.ADD)
    builder_type.create_atomic_cas = atomic(builder_type.create_atomic_cas)
    I.GridExecutor.__call__ = call
    try:
        yield run
    finally:
        I.GridExecutor.__call__ = saved_call
        for name, value in saved.items():
            if value is None:
                delattr(builder_type, name)
            else:
                setattr(builder_type, name, value)


def _run_programs(fn, args: dict, grid: tuple, run: _Run, builder) -> None:
    """Every program of `grid`, taken in grid order (x slowest, as the interpreter's loop) or reversed by
    run.workers threads; the first error (a hang included) is raised here once every thread has stopped."""
    indices = [(x, y, z) for x in range(grid[0]) for y in range(grid[1]) for z in range(grid[2])]
    order = iter(indices[::-1] if run.reverse else indices)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        while not errors:
            with lock:
                index = next(order, None)
            if index is None:
                return
            builder.set_grid_idx(*index)
            run.started()
            well = False
            try:
                fn(**args)
                well = True
            except BaseException as error:   # noqa: BLE001 - handed to the launching thread
                errors.append(error)
                run.deadline = 0.0   # the others stop at their next atomic
            finally:
                run.ended(well)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(run.workers, len(indices)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(1.0, run.deadline - time.monotonic() + 30.0))
    if any(thread.is_alive() for thread in threads):
        raise ProgramsHung("a program neither ended nor reached an atomic after the deadline")
    if errors:
        hung = [e for e in errors if _hung(e)]
        raise (ProgramsHung(str(_hung(hung[0]))) if hung else errors[0])


def _hung(error: BaseException | None):
    """The ProgramsHung behind `error` (the interpreter wraps a device function's errors), or None."""
    while error is not None and not isinstance(error, ProgramsHung):
        error = error.__cause__
    return error
