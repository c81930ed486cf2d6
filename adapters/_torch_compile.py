"""Shared by every op's `torch_compile` and `torch_compile_max_autotune` rows: `torch.compile` of another
row's composition (the op's diffusers row), as a user writes it: `torch.compile(fn)` or
`torch.compile(fn, mode="max-autotune-no-cudagraphs")`, automatic dynamic shapes (no `dynamic=`, no
marked dims), so the first batch size compiles a static graph and the second recompiles a dynamic one.

Compile time: Dynamo reports the start and end of every compilation (a frame's first compile or
recompile, and the backward AOTAutograd compiles lazily at the first backward of a dynamic graph) to
callbacks (torch._dynamo.callback). They add each compilation's seconds to the tally of the row whose
compiled function ran last: the harness runs a row's backward right after that row's forward, never
another row's call in between. A Triton kernel's runtime autotuning at its first launch is not a
compilation and is not counted. In a plan without warm-up (the quick plan), the first timed sample of a
figure that needs a new graph (the no-grad forward) holds that compile; the full plan's warm-up takes it.

Budget: a row's compilations together may take the run plan's `[compile]` budget for its mode
(harness/config.py CompilePlan; `COMPILE_BUDGET_S[mode]` where the plan has none). A compilation that
starts inside the row's own call on the main thread (its forward's) is stopped by a timer when it passes
the budget (SIGALRM, armed only while such a compilation runs and only when no other timer is armed);
any other (a lazily compiled backward, a compilation on another thread) is checked as it ends. The row
then becomes unavailable with the reason and the seconds spent (harness/runner.py reads the tally).
"""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from typing import Any, Callable, Optional

import torch

from h3bench.harness import gpu_turns, library_output
from h3bench.harness.compile_cache import INDUCTOR_VARIABLE
from h3bench.harness.adapter import Adapter, CompileTally, Loaded, RowSkipped

DEFAULT = "default"
MAX_AUTOTUNE = "max-autotune-no-cudagraphs"

# Seconds a row's compilations may take together where the run's plan has no [compile] table (the shipped
# plans have one): the bound that keeps a run in bounded time (docs/decisions.md, "torch.compile rows").
COMPILE_BUDGET_S = {DEFAULT: 600.0, MAX_AUTOTUNE: 30.0}

# Dynamo runs a code object's guard sets past `recompile_limit` (8) eagerly, and the probes make more than a
# user's loop (batch sizes, no-grad, layouts, each frozen parameter set): raised while the hooks are
# installed (`_Hooks.install`) so every call runs compiled code (docs/decisions.md, "torch.compile rows").
RECOMPILE_LIMIT = 64

# On a CPU both rows run only when named: cold C++ compiles would double the quick CPU run's time
# (docs/decisions.md, "torch.compile rows").
CPU_COST = ("Inductor's cold C++ compiles take tens of seconds on a CPU, as long as the quick CPU run's other "
            "rows together")
# max-autotune on a CPU is not what the row stands for: no CUDA graphs to leave out, no Triton templates
# or coordinate descent; its autotuning there only chooses among the C++ GEMM templates.
MAX_AUTOTUNE_ON_CPU = (f"mode {MAX_AUTOTUNE!r} stands for GPU autotuning (Triton GEMM templates, coordinate "
                       "descent, CUDA graphs left out); on a CPU it only chooses among C++ GEMM templates")

# Inductor settings that decide bits and speed, named in the source string as the mode leaves them.
SETTINGS = ("max_autotune", "coordinate_descent_tuning", "triton.cudagraphs", "fallback_random",
            "emulate_precision_casts", "deterministic")
CPU_SETTINGS = ("cpp.simdlen", "cpp.threads", "cpp.enable_floating_point_contract_flag",
                "cpp.enable_unsafe_math_opt_flag", "cpp_wrapper", "freezing")
DYNAMO_SETTINGS = ("automatic_dynamic_shapes", "assume_static_by_default")


class CompileBudgetExceeded(RuntimeError):
    """A row's compilations passed its budget."""


class _BudgetStop(BaseException):
    """The budget's timer going off inside a compilation. Not an Exception: Inductor compiles each
    autotuning choice under `except Exception`, logs the failure and goes on with the next choice, so a
    RuntimeError would not stop the compilation (docs/decisions.md, "torch.compile rows"). The timer is
    armed only inside the row's own call, which turns this into CompileBudgetExceeded (`compiled_load`)."""


class _RowCompile:
    """One loaded row's tally and budget."""

    def __init__(self, mode: str, budget_s: Optional[float]):
        self.mode, self.tally = mode, CompileTally(mode=mode, budget_s=budget_s)

    @property
    def budget_s(self) -> Optional[float]:
        """The budget the run set (or the row was given), else the mode's own."""
        return self.tally.budget_s if self.tally.budget_s is not None else COMPILE_BUDGET_S.get(self.mode)

    def spend(self, seconds: float) -> None:
        self.tally.seconds += seconds
        self.tally.compiles += 1
        if self.budget_s is not None and self.tally.seconds > self.budget_s and self.tally.overrun is None:
            self.overrun(self.tally.seconds)

    def overrun(self, spent: float) -> str:
        self.tally.overrun = (f"CompileBudgetExceeded: torch.compile(mode={self.mode!r}) spent {spent:.1f} s "
                              f"compiling, past its budget of {self.budget_s:g} s "
                              f"({self.tally.compiles} compilation(s) finished)")
        return self.tally.overrun


class _Hooks:
    """Dynamo's compile callbacks, installed once for every compiled row; `current` is the
    row whose compiled function ran last."""

    def __init__(self):
        self.current: Optional[_RowCompile] = None
        # the row whose compiled function the main thread is inside: only there may the timer raise
        self.calling: Optional[_RowCompile] = None
        self._compiling: Optional[_RowCompile] = None
        self._started = 0.0
        self._previous_handler: Any = None
        self._diversion: Optional[library_output.Diversion] = None
        self._previous_limit: Optional[int] = None

    def install(self) -> None:
        """Register the callbacks unless they are (torch._dynamo.reset() clears every callback, so this
        looks at the handler's lists, not at a flag of its own), and raise Dynamo's recompile limit to
        RECOMPILE_LIMIT (kept as found where it is higher)."""
        import torch._dynamo.config as dynamo_config
        from torch._dynamo.callback import callback_handler
        if self._previous_limit is None:
            self._previous_limit = dynamo_config.recompile_limit
            dynamo_config.recompile_limit = max(self._previous_limit, RECOMPILE_LIMIT)
        if self._on_start not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(self._on_start)
        if self._on_end not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(self._on_end)

    def uninstall(self) -> None:
        """Take the callbacks out again and put the recompile limit back (tests: leave the process as found)."""
        import torch._dynamo.config as dynamo_config
        from torch._dynamo.callback import callback_handler
        if self._previous_limit is not None:
            dynamo_config.recompile_limit, self._previous_limit = self._previous_limit, None
        if self._on_start in callback_handler.start_callbacks:
            callback_handler.remove_start_callback(self._on_start)
        if self._on_end in callback_handler.end_callbacks:
            callback_handler.remove_end_callback(self._on_end)
        self.current = None

    def _on_start(self, _args) -> None:
        row = self.current
        if row is None:
            return
        if row.tally.overrun is not None:  # the budget is spent: no further compilation
            raise CompileBudgetExceeded(row.tally.overrun)
        if threading.current_thread() is threading.main_thread():
            # A compilation runs inside one call of a probe's step, up to the row's compile budget,
            # and a measurement another run waits for (harness/gpu_turns.py) would wait that long, keeping
            # every other run's probes from starting: let it in first. Its wait is no compile time.
            gpu_turns.let_measurement_in()
        self._compiling, self._started = row, time.perf_counter()
        # Inductor prints max-autotune's benchmark tables to stderr: they go to the run's log
        self._diversion = library_output.divert(f"torch.compile(mode={row.mode!r}) compiling")
        if row.budget_s is not None:
            self._arm(row, row.budget_s - row.tally.seconds)

    def _on_end(self, _args) -> None:
        self._disarm()
        row, self._compiling = self._compiling, None
        if self._diversion is not None:
            self._diversion, diversion = None, self._diversion
            diversion.end()
        if row is None:
            return
        row.spend(time.perf_counter() - self._started)

    def _arm(self, row: _RowCompile, seconds: float) -> None:
        if threading.current_thread() is not threading.main_thread() or self.calling is not row:
            return  # raised anywhere else, _BudgetStop would pass the harness's blame (harness/execute.py)
        if signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0) or signal.getsignal(signal.SIGALRM) not in (
                signal.SIG_DFL, None):
            return  # someone else's timer: fall back to the check as each compilation ends

        def stop(_signum, _frame):
            if self._compiling is row:  # not a compilation that has just ended
                row.overrun(row.tally.seconds + time.perf_counter() - self._started)
                raise _BudgetStop()

        self._previous_handler = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))

    def _disarm(self) -> None:
        if self._previous_handler is None:
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous_handler)
        self._previous_handler = None


HOOKS = _Hooks()


def _setting(root: Any, dotted: str, options: dict) -> Any:
    if dotted in options:
        return options[dotted]
    value = root
    for part in dotted.split("."):
        value = getattr(value, part, None)
    return value


def describe_settings(mode: str, device: torch.device) -> str:
    """The Inductor and Dynamo settings the compiled code depends on, as `mode` leaves them."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor as inductor
    import torch._inductor.config as inductor_config

    options = inductor.list_mode_options(None if mode == DEFAULT else mode)
    names = SETTINGS + (CPU_SETTINGS if device.type == "cpu" else ())
    inductor_part = ", ".join(f"{n}={_setting(inductor_config, n, options)}" for n in names)
    dynamo_part = ", ".join(f"{n}={_setting(dynamo_config, n, {})}" for n in DYNAMO_SETTINGS)
    return f"inductor: {inductor_part}; dynamo: {dynamo_part}"


def _check_cpp_compiler() -> None:
    import torch._inductor.config as inductor_config

    if not any(c and shutil.which(c) for c in inductor_config.cpp.cxx):
        raise RuntimeError(f"Inductor's C++ backend needs a C++ compiler: none of {inductor_config.cpp.cxx} "
                           "is on PATH")


def compiled_load(base: Adapter, mode: str,
                  budget_s: Optional[float] = None) -> Callable[[torch.device, Any], Loaded]:
    """A row's `load`: `base`'s function compiled with `mode` (DEFAULT: no mode argument), its compile
    time counted and held to `budget_s` (None: the run plan's [compile] budget for `mode`, set in the
    row's tally by the runner; COMPILE_BUDGET_S[mode] without one)."""
    def load(device: torch.device, params: Any) -> Loaded:
        if mode == MAX_AUTOTUNE and device.type == "cpu":
            raise RowSkipped(MAX_AUTOTUNE_ON_CPU)
        if device.type == "cpu":
            _check_cpp_compiler()
        inner = base.load(device, params)
        compiled = torch.compile(inner.fn) if mode == DEFAULT else torch.compile(inner.fn, mode=mode)
        row = _RowCompile(mode, budget_s)
        # at load, not per call (the check would cost every timed call): the harness never resets Dynamo
        # between a row's load and its calls
        HOOKS.install()

        def fn(*args):
            HOOKS.current = HOOKS.calling = row
            try:
                return compiled(*args)
            except _BudgetStop:
                raise CompileBudgetExceeded(row.tally.overrun) from None
            finally:
                HOOKS.calling = None

        mode_text = "" if mode == DEFAULT else f"mode={mode!r}, "
        source = (f"torch {torch.__version__} torch.compile({mode_text}automatic dynamic shapes) of "
                  f"[{inner.source}]; {describe_settings(mode, device)}; compile budget "
                  + (f"{budget_s:g} s" if budget_s is not None else "the run plan's [compile] table's")
                  + f"; Inductor's caches in {os.environ.get(INDUCTOR_VARIABLE) or 'the temporary directory'}")
        brief = f"torch {torch.__version__} torch.compile({mode_text}automatic dynamic shapes) of the {base.name} row"
        return Loaded(fn=fn, source=source, compile_tally=row.tally, brief=brief)

    return load


def compiled_row(base: Adapter, name: str, mode: str) -> Adapter:
    """The row `name` of `base`'s op: `base` compiled with `mode`."""
    label = "torch.compile" if mode == DEFAULT else f"torch.compile(mode={mode!r})"
    return Adapter(name=name, op=base.op, grads=base.grads, load=compiled_load(base, mode),
                   summary=f"{label} of the {base.name} row's composition", reference=base.reference,
                   cpu_only_when_named=CPU_COST)
