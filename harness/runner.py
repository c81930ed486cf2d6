"""Wires config, adapters, modes and probes together and writes the evidence file.

The runner knows no adapter, no tensor and no probe detail. Per mode it loads each adapter, hands it to
the probes, and then times every measured row together (rows interleaved: harness/timing.py).

Blame: an adapter that fails to load, or whose own code raises inside a probe (`ImplementationError`,
harness/execute.py), becomes that row's `{"unavailable": ...}`. Any other exception is a harness bug: it
propagates, the run stops with its traceback, and no file is written.

Modes: `plain` runs in this process; every other mode runs in a child process of its own
(harness/children.py), since a mode patches aten for the whole process and its environment must be set
before CUDA starts. A child that crashes or hangs makes that mode `{"unavailable": ...}`; the others stay.

Control: after the modes, this process puts the run's negative control (harness/control.py) through the
batch-invariance probes, once per op and with no mode switched on; a mode's child leaves it to its parent.
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

import torch

from h3bench.harness import control, environment, gpu_turns, library_output
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.config import RunConfig
from h3bench.harness.execute import ImplementationError, device_usable, describe_exception
from h3bench.harness.floors import Rates, rates_of
from h3bench.harness.modes import ActiveMode, ModeSpec, get_mode
from h3bench.harness.ops import get_op
from h3bench.harness.ops.base import Op
from h3bench.harness.probes import accuracy_latency as acc
from h3bench.harness.probes import batch_invariance as bi
from h3bench.harness.probes import registry
from h3bench.harness.probes.context import ProbeContext
from h3bench.harness.probes.registry import ProbeSpec, Turn
from h3bench.harness.schema import (ControlSkipped, Environment, Evidence, RowResult, SizeResult, TimingRecord,
                                    UnavailableMode, UnavailableRow, save)
from h3bench.harness.peak_memory import readers_for
from h3bench.harness.request import Observer, RunRequest, SilentObserver
from h3bench.harness.timing import FLUSH_BYTES, GRAPH_WARMUP, graph_capture_for, timer_for

T = TypeVar("T")
INTERLEAVED = "rows round-robin: each row takes a block of samples per turn, the order rotating each round"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cuda", "cpu"):
        raise ValueError(f"--device must be auto, cuda or cpu, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (torch.cuda.is_available() is False)")
    return torch.device(name)


def _planned(config: RunConfig) -> list[tuple[ProbeSpec, Any]]:
    """Each probe a row runs under `config`, with its plan, in PROBES' order (harness/probes/registry.py): a
    probe beyond the RFC's runs where the config has its table."""
    return [(probe, config.plan(probe.plan_table)) for probe in registry.probes()
            if config.plan(probe.plan_table) is not None]


def probe_totals(config: RunConfig, ctx: ProbeContext) -> dict[str, int]:
    """Progress units per probe of one row (some depend on the device and on the op's inputs: `ctx`)."""
    return {probe.name: probe.total(plan, ctx) for probe, plan in _planned(config)}


GRAPH_METHOD = (f"cuda_graph replay, per-sample synchronized (captured once after {GRAPH_WARMUP} side-stream "
                "warm-up calls)")
FLUSH_APPLIES_TO = ("each synchronized (*_us) and graph (*_graph_us) sample, outside its timed region; not the "
                    "back-to-back (*_stream_us) samples, which follow each other with no gap")


def graph_method(device: torch.device, enabled: bool = True) -> str:
    """environment.timing.graph: how the *_graph_us figures were taken, or why there are none."""
    if not enabled:
        return "none: off ([timing] graph = false; --graph-timing takes them)"
    if graph_capture_for(device) is None:
        return f"none: CUDA graphs need a CUDA device (this run's device is {device.type})"
    return GRAPH_METHOD


def timing_record(config: RunConfig, device: torch.device) -> TimingRecord:
    t = config.timing
    return TimingRecord(sample="synchronized", stream="back-to-back", timer=timer_for(device), warmup=t.warmup,
                        reps=t.reps, repeats=t.repeats, block=t.block, interleaved=INTERLEAVED,
                        graph=graph_method(device, t.graph), flush_l2=t.flush_l2,
                        flush_bytes=FLUSH_BYTES if t.flush_l2 else None,
                        flush_applies_to=FLUSH_APPLIES_TO if t.flush_l2 else None)


def run(request: RunRequest, observer: Optional[Observer] = None) -> Evidence:
    """Every mode of the request, merged into one evidence file (written to `request.out` if set)."""
    from h3bench.harness import children  # the child machinery imports the fan-out scheduler only when needed

    observer = observer or SilentObserver()
    started = time.perf_counter()
    op = get_op(request.config.op)
    if request.control_only:
        return _control_only(request, op, observer, started)
    for adapter in request.adapters:
        if adapter.op != op.name:
            raise ValueError(f"adapter {adapter.name!r} is for op {adapter.op!r}, not {op.name!r}")
    specs = [get_mode(name) for name in request.modes]
    here = [s for s in specs if s.in_process or request.in_process]
    with library_output.kept_in(library_log_path(request.out)):
        parts = {spec.name: measure_mode(request, op, spec, observer) for spec in here}
    away = [s for s in specs if s not in here]
    if away:
        parts.update(children.run_modes(request, away, observer))
    evidence = combine_modes(op, request, [parts[s.name] for s in specs])
    evidence.control = measure_control(request, op, observer)
    evidence.wall_s = round(time.perf_counter() - started, 3)
    if request.out is not None:
        save(evidence, request.out)
    return evidence


# --- the negative control ---------------------------------------------------------------------------------

def measure_control(request: RunRequest, op: Op, observer: Observer) -> Optional[control.Record]:
    """The run's negative control (harness/control.py), measured here in the plain mode (no mode is
    switched on in this process); None where another process of the run measures it. Blame as for a row:
    the composition's own failure is the control's recorded reason, a harness error propagates."""
    if request.control != control.HERE:
        return control.unmeasured(request.control)
    _disable_tf32()
    observer.phase_started("plain", f"control: {op.control_subject} with a planted batch-size fault",
                           control.probe_units(request.config))
    try:
        record = gpu_turns.shared_else_alone(  # bitwise probes only
            lambda: control.measure(op, request.control_adapter, request.config, request.device,
                                    progress=_letting_measurements_in(observer.advance)))
    except ImplementationError as exc:
        _require_usable_device(request.device, "control", str(exc))
        record = ControlSkipped(skipped=f"the control failed: {exc}")
    finally:
        observer.phase_finished()
        _release(request.device)
    return record


def _control_only(request: RunRequest, op: Op, observer: Observer, started: float) -> Evidence:
    """The control alone, in a file with no rows: a fan-out's control job (harness/suite.py)."""
    evidence = _evidence_without_rows(op, request)
    evidence.control = measure_control(request, op, observer)
    evidence.wall_s = round(time.perf_counter() - started, 3)
    if request.out is not None:
        save(evidence, request.out)
    return evidence


# --- one mode, in this process -------------------------------------------------------------------------

def measure_mode(request: RunRequest, op: Op, spec: ModeSpec, observer: Observer) -> Evidence:
    """One mode's evidence, measured here: the mode switched on and checked, then every row.

    The environment is captured before the switch, so every mode's part records the same process-wide
    settings (TF32 off, the bandwidths) and the parts merge; what a mode itself changes (its torch
    flags, the ops it replaced) goes into its own `mode_environment` record."""
    _disable_tf32()
    mode_env = mode_variables(spec)
    if spec.needs:
        mode_env["libraries"] = {name: environment.library_version(name) for name in spec.needs}
    env = _environment(op, request, {spec.name: mode_env})
    try:
        active = spec.switch()
        found = active.check()
    except Exception as exc:  # the mode's library did not import or did not switch on: that mode's verdict
        return evidence_of(op, request, env, {spec.name: UnavailableMode(unavailable=describe_exception(exc))})
    mode_env.update(active.record)
    if found:
        mode_env["active"] = found
    return evidence_of(op, request, env, {spec.name: measure_rows(request, op, spec, active,
                                                                  rates_of(env), observer)})


def mode_variables(spec: ModeSpec) -> dict:
    """environment.mode_environment.<mode>: the variables the mode sets (the RFC's record), then what
    h3bench adds (libraries, the switch, the active check)."""
    return dict(spec.environment)


def evidence_of(op: Op, request: RunRequest, env: Environment, results: dict) -> Evidence:
    return Evidence(
        kind="h3_prior_art", rfc=op.rfc, op=op.name,
        rl_kernel_commit=environment.rl_kernel_commit(),
        tracked_tree_dirty=environment.tracked_tree_dirty(),
        environment=env, quick=request.config.quick, results=results,
        h3bench_commit=environment.h3bench_commit(),
        created_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        config=request.config.to_dict(), command=request.command or None,
    )


@dataclass
class _Measured:
    adapter: Adapter
    name: str  # the row's name in the evidence
    loaded: Loaded
    load_s: float
    probes: dict = field(default_factory=dict)
    probe_wall: dict[str, float] = field(default_factory=dict)
    sizes: dict[str, SizeResult] = field(default_factory=dict)


def measure_rows(request: RunRequest, op: Op, spec: ModeSpec, active: ActiveMode, rates: Optional[Rates],
                 observer: Observer) -> dict:
    """Each row's probes in turn, then every measured row timed together."""
    rows: dict[str, RowResult | UnavailableRow] = {}
    measured: list[_Measured] = []
    for adapter in request.adapters:
        name = op.row_name(adapter.name, spec.name)
        row_or_measured = _probe_row(request, op, spec, active, adapter, name, observer)
        if isinstance(row_or_measured, UnavailableRow):
            rows[name] = row_or_measured
            observer.row_finished(spec.name, name, row_or_measured)
        else:
            measured.append(row_or_measured)
            rows[name] = None  # placeholder keeps the adapters' order
        _release(request.device)
    if measured:
        with gpu_turns.exclusive():  # the latency rounds time a GPU no other run works on
            _time_rows(request, op, spec, measured, rates, observer)
    for m in measured:
        rows[m.name] = _row_result(m, request.device)
        observer.row_finished(spec.name, m.name, rows[m.name])
    return rows


def _probe_row(request: RunRequest, op: Op, spec: ModeSpec, active: ActiveMode, adapter: Adapter, name: str,
               observer: Observer) -> _Measured | UnavailableRow:
    work = _WorkTime(request.device)
    cfg = request.config
    ctx = ProbeContext(op=op, params=cfg.inputs, fn=None, grads=adapter.grads, device=request.device,
                       reference_variant=adapter.reference or op.name,
                       progress=_letting_measurements_in(observer.advance),
                       reference_guard=active.reference_off if spec.reference_with_mode_off else contextlib.nullcontext)
    observer.row_started(spec.name, name, probe_totals(cfg, ctx))
    # a load may build, compile or allocate: not while another run measures
    loaded, load_s = gpu_turns.shared_else_alone(
        lambda: work.timed(lambda: adapter.try_load(request.device, cfg.inputs)),
        ran_out=lambda timed: _out_of_memory_reason(timed[0]))
    if not isinstance(loaded, Loaded):
        return UnavailableRow(unavailable=loaded, wall_s=work.total())
    ctx.fn = loaded.fn
    tally = loaded.compile_tally
    if tally is not None and tally.budget_s is None and cfg.compile is not None:  # the plan's, before any call
        tally.budget_s = cfg.compile.budget_s(tally.mode)
    measured = _Measured(adapter=adapter, name=name, loaded=loaded, load_s=load_s)
    current = None
    try:
        for probe, plan in _planned(cfg):
            current = probe.name
            observer.probe_started(current)
            measured.probes[current], measured.probe_wall[current] = _in_turn(
                probe, lambda: work.timed(lambda: probe.run(ctx, plan)))
    except ImplementationError as exc:  # the implementation's own failure is its row's verdict
        _require_usable_device(request.device, name, str(exc))
        return _failed_row(loaded, exc, current, work.total())
    except DeviceLost:
        raise
    except RuntimeError as exc:
        # A CUDA error in the harness's code of a probe: with the context unusable after it, a kernel the
        # row's calls queued faulted (the bitwise probes wait for them only before they read back,
        # harness/probes/context.py `settle`, and a fault the device reports earlier surfaces at the next
        # launch, which may be the harness's: index selects and bitwise comparisons, which cannot fault).
        _require_usable_device(request.device, name,
                               f"a fault reported at a later launch, in its {current} probe: "
                               f"{describe_exception(exc)} (CUDA_LAUNCH_BLOCKING=1 reports it at the launch)")
        raise  # the context works: the harness's own error
    measured.sizes = measured.probes[acc.PROBE.name]
    return measured


def _in_turn(probe: ProbeSpec, step: Callable[[], T]) -> T:
    """The probe in the turn it takes on a GPU shared with other runs (harness/gpu_turns.py): alone for one
    that loads the GPU on purpose and compares with idle (contention); shared for the bitwise probes (run again
    alone where they ran out of memory beside the other runs)."""
    if probe.turn is Turn.EXCLUSIVE:
        with gpu_turns.exclusive():
            return step()
    return gpu_turns.shared_else_alone(step)


def _letting_measurements_in(advance: Callable[[int], None]) -> Callable[[int], None]:
    """A probe's progress callback that, at each step, lets another run's waiting measurement have the GPU
    (harness/gpu_turns.py `let_measurement_in`). A pause between two steps changes no bits: the probe's
    tensors stay as they are, and its kernels finish before the measurement starts."""
    def progress(n: int) -> None:
        gpu_turns.let_measurement_in()
        advance(n)
    return progress


class _WorkTime:
    """A row's time inside its turns (harness/gpu_turns.py), the waits for a turn left out: on a GPU shared
    with other runs a row waits while another run measures, and that wait is not the row's cost (nor the
    waits inside a probe's turn for the turn back after letting a measurement in)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = 0.0  # every step's, a failed or repeated attempt's too

    def timed(self, step: Callable[[], T]) -> tuple[T, float]:
        """(step's result, its seconds), the device synchronized before the clock stops."""
        t0, let_in_t0 = time.perf_counter(), gpu_turns.let_in_wait_s()
        try:
            result = step()
            _sync(self.device)
        finally:
            elapsed = time.perf_counter() - t0 - (gpu_turns.let_in_wait_s() - let_in_t0)
            self.seconds += elapsed
        return result, round(elapsed, 3)

    def total(self) -> float:
        return round(self.seconds, 3)


def _out_of_memory_reason(loaded: Loaded | str) -> bool:
    """A load's reason that is torch's OutOfMemoryError (Adapter.try_load describes it "Type: message")."""
    return isinstance(loaded, str) and loaded.startswith(f"{torch.OutOfMemoryError.__name__}:")


def _time_rows(request: RunRequest, op: Op, spec: ModeSpec, measured: list[_Measured], rates: Optional[Rates],
               observer: Observer) -> None:
    cfg = request.config
    timed = [acc.TimedRow(name=m.name, fn=m.loaded.fn, grads=m.adapter.grads, sizes=m.sizes)
             for m in measured]
    capture = graph_capture_for(request.device) if cfg.timing.graph else None
    observer.phase_started(spec.name, "latency, rows interleaved",
                           acc.latency_units(cfg.accuracy, cfg.timing, graph=capture is not None))
    t0 = time.perf_counter()
    acc.time_rows(op, cfg.inputs, timed, cfg.accuracy, cfg.timing, request.device, rates,
                  progress=observer.advance, graph_capture=capture, memory=readers_for(request.device))
    observer.phase_finished()
    share = round((time.perf_counter() - t0) / len(measured), 3)
    for m, t in zip(measured, timed):
        m.probe_wall[acc.PROBE.name] = round(m.probe_wall[acc.PROBE.name] + share, 3)
        if t.error is not None:
            m.probes["error"] = t.error
    failed = [t for t in timed if t.error is not None]
    if failed:
        _require_usable_device(request.device, failed[0].name, str(failed[0].error))


class DeviceLost(RuntimeError):
    """A row's failure left the CUDA context unusable: no later row (or reference) can run in this
    process, so the run stops instead of recording every later row as failing with the same error.
    Rows share one process; run that op without the row (`--adapters`), or its row alone."""


def _require_usable_device(device: torch.device, row: str, error: str) -> None:
    if not device_usable(device):
        raise DeviceLost(f"row {row!r} failed with {error!r} and left the CUDA context on {device} unusable: "
                         f"the rows after it cannot run in this process. Run the op without it "
                         f"(--adapters) or that row alone to see its own verdict.")


def _row_result(m: _Measured, device: torch.device) -> RowResult | UnavailableRow:
    # The row's own time: its load, its probes and its share of the interleaved latency rounds.
    wall = round(m.load_s + sum(m.probe_wall.values()), 3)
    tally = m.loaded.compile_tally
    if "error" in m.probes or (tally and tally.overrun):
        # a compile budget spent where the compiler carried on (a fallback) still ends the row
        return _failed_row(m.loaded, m.probes.get("error"), acc.PROBE.name if "error" in m.probes else None,
                           wall)
    return RowResult(
        source=m.loaded.source, has_backward=m.adapter.has_backward, batch_invariance=bi.verdict_of(m.probes),
        accuracy_latency=m.sizes, wall_s=wall, probe_wall_s=m.probe_wall, timer=timer_for(device),
        compile_s=_compile_seconds(m.loaded), compiles=tally.compiles if tally else None,
        reference=m.adapter.reference,
    )


def _failed_row(loaded: Loaded, error: Optional[Exception], failed_probe: Optional[str],
                wall_s: float) -> UnavailableRow:
    """A row that failed in `failed_probe`: the compile budget it spent, where it did, else its error."""
    tally = loaded.compile_tally
    return UnavailableRow(unavailable=(tally and tally.overrun) or str(error), source=loaded.source,
                          failed_probe=failed_probe, wall_s=wall_s, compile_s=_compile_seconds(loaded))


def _compile_seconds(loaded: Loaded) -> Optional[float]:
    return round(loaded.compile_tally.seconds, 3) if loaded.compile_tally else None


def _disable_tf32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def library_log_path(out: Optional[Path]) -> Optional[Path]:
    """Where a run's library output goes (harness/library_output.py): beside its evidence file."""
    return None if out is None else Path(out).with_suffix(".library.log")


def default_out_path(op: str, device: torch.device, quick: bool) -> Path:
    """runs/<op>_<device>[_quick]_<time>.json, with -2, -3, ... where a run of the same second wrote one
    (the file, or the folder an --op all run makes of the path)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{op}_{device.type}{'_quick' if quick else ''}_{stamp}"
    path, n = base.with_suffix(".json"), 2
    while path.exists() or path.with_suffix("").exists():
        path, n = base.with_name(f"{base.name}-{n}.json"), n + 1
    return path


def _evidence_without_rows(op: Op, request: RunRequest) -> Evidence:
    """A file with this process's environment and no mode's rows yet."""
    return evidence_of(op, request, _environment(op, request, {}), {})


def _environment(op: Op, request: RunRequest, mode_environment: dict) -> Environment:
    """This process's environment record; its bandwidths are measured on a GPU no other run works on
    (an exclusive turn, harness/gpu_turns.py)."""
    with gpu_turns.exclusive():
        return _without_floors_unless_declared(op, environment.capture(
            request.device, mode_environment, request.measure_bandwidth,
            timing_record(request.config, request.device)))


NO_TRAFFIC = "none: the op declares no floor_traffic (its bytes read and written), so it has no memory floors"


def _without_floors_unless_declared(op: Op, env: Environment) -> Environment:
    """`env`, whose floor model says there is none where the op declares no traffic (a user op may leave
    it out): the bandwidths stay measured, no floor is made from them."""
    if not op.declares_traffic and env.floor_model:
        env.floor_model = NO_TRAFFIC
    return env


def combine_modes(op: Op, request: RunRequest, parts: Sequence[Evidence | UnavailableMode]) -> Evidence:
    """One evidence file from the modes' parts, in the requested mode order."""
    from h3bench.harness.merge import merge

    measured = [p for p in parts if isinstance(p, Evidence)]
    if measured:
        combined = measured[0]
        for part in measured[1:]:
            combined = merge(combined, part)
    else:  # every mode failed in its child: the environment is this process's
        combined = _evidence_without_rows(op, request)
    ordered: dict = {}
    for name, part in zip(request.modes, parts):
        if isinstance(part, UnavailableMode):
            ordered[name] = part
            combined.environment.mode_environment.setdefault(name, mode_variables(get_mode(name)))
        else:
            ordered[name] = combined.results[name]
    combined.results = ordered
    combined.environment.mode_environment = {name: combined.environment.mode_environment[name]
                                             for name in request.modes}
    combined.command = request.command or None
    return combined
