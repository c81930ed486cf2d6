"""Wires config, adapters and probes together and writes the evidence file.

The runner knows no adapter and no probe detail: it loads each adapter, hands it to the probes,
turns any failure into that row's "unavailable" reason, and writes the file atomically.
"""
from __future__ import annotations

import datetime
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

import torch

from harness import environment
from harness.adapter import Adapter, Loaded, describe_exception
from harness.config import RunConfig
from harness.modes import get_mode
from harness.ops import get_op
from harness.probes import accuracy_latency as acc
from harness.probes import batch_invariance as bi
from harness.probes.context import ProbeContext
from harness.schema import Evidence, RowResult, UnavailableRow, save
from harness.timing import timer_for

PROBES = ("all_rows", "full_vs_sub_batches", "batch_size_sweep", "accuracy_latency")


class Observer(Protocol):
    """Progress sink: the CLI shows a rich progress bar; tests and --quiet pass a silent one."""

    def row_started(self, mode: str, name: str, totals: dict[str, int]) -> None: ...
    def probe_started(self, probe: str) -> None: ...
    def advance(self, n: int) -> None: ...
    def row_finished(self, mode: str, name: str, row: RowResult | UnavailableRow) -> None: ...


class SilentObserver:
    def row_started(self, mode, name, totals): pass
    def probe_started(self, probe): pass
    def advance(self, n): pass
    def row_finished(self, mode, name, row): pass


@dataclass
class RunRequest:
    config: RunConfig
    device: torch.device
    adapters: list[Adapter]
    modes: list[str]
    out: Optional[Path]
    command: str = ""
    measure_bandwidth: bool = True


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cuda", "cpu"):
        raise ValueError(f"--device must be auto, cuda or cpu, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (torch.cuda.is_available() is False)")
    return torch.device(name)


def probe_totals(config: RunConfig) -> dict[str, int]:
    return {"all_rows": bi.all_rows_total(config.all_rows),
            "full_vs_sub_batches": bi.sub_batches_total(config.full_vs_sub),
            "batch_size_sweep": bi.sweep_total(config.sweep),
            "accuracy_latency": len(config.accuracy.rows)}


def run(request: RunRequest, observer: Optional[Observer] = None) -> Evidence:
    observer = observer or SilentObserver()
    started = time.perf_counter()
    op = get_op(request.config.op)
    for adapter in request.adapters:
        if adapter.op != op.name:
            raise ValueError(f"adapter {adapter.name!r} is for op {adapter.op!r}, not {op.name!r}")
    _disable_tf32()
    results: dict[str, dict] = {}
    mode_environment: dict[str, dict] = {}
    bandwidth: Optional[float] = None
    env = None
    for mode in request.modes:
        with get_mode(mode)() as mode_env:
            mode_environment[mode] = mode_env
            if env is None:
                env = environment.capture(request.device, mode_environment, request.measure_bandwidth)
                bandwidth = env.copy_bandwidth_gbps
            rows = results.setdefault(mode, {})
            for adapter in request.adapters:
                row = _run_adapter(request, op, adapter, bandwidth, mode, observer)
                rows[adapter.name] = row
                observer.row_finished(mode, adapter.name, row)
                _release(request.device)
    env.mode_environment = mode_environment
    evidence = Evidence(
        kind="h3_prior_art", rfc=op.rfc, op=op.name,
        rl_kernel_commit=environment.rl_kernel_commit(),
        tracked_tree_dirty=environment.tracked_tree_dirty(),
        environment=env, quick=request.config.quick, results=results,
        h3bench_commit=environment.h3bench_commit(),
        created_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        config=request.config.to_dict(), command=request.command or None,
        wall_s=round(time.perf_counter() - started, 3),
    )
    if request.out is not None:
        save(evidence, request.out)
    return evidence


def _run_adapter(request: RunRequest, op, adapter: Adapter, bandwidth: Optional[float], mode: str,
                 observer: Observer) -> RowResult | UnavailableRow:
    started = time.perf_counter()
    observer.row_started(mode, adapter.name, probe_totals(request.config))
    loaded = adapter.try_load(request.device)
    if not isinstance(loaded, Loaded):
        return UnavailableRow(unavailable=loaded, wall_s=round(time.perf_counter() - started, 3))
    ctx = ProbeContext(op=op, params=request.config.inputs, fn=loaded.fn, grads=adapter.grads,
                       device=request.device, reference_variant=adapter.reference or op.references[0],
                       progress=observer.advance)
    cfg = request.config
    probe_wall: dict[str, float] = {}
    current = "load"
    try:
        steps = {
            "all_rows": lambda: bi.all_rows(ctx, cfg.all_rows),
            "full_vs_sub_batches": lambda: bi.full_vs_sub_batches(ctx, cfg.full_vs_sub),
            "batch_size_sweep": lambda: bi.batch_size_sweep(ctx, cfg.sweep),
            "accuracy_latency": lambda: acc.accuracy_latency(ctx, cfg.accuracy, cfg.timing, bandwidth),
        }
        found = {}
        for current in PROBES:
            observer.probe_started(current)
            t0 = time.perf_counter()
            found[current] = steps[current]()
            _sync(request.device)
            probe_wall[current] = round(time.perf_counter() - t0, 3)
    except Exception as exc:  # a broken implementation is a table cell, not a crashed run
        return UnavailableRow(unavailable=describe_exception(exc), source=loaded.source,
                              failed_probe=current, wall_s=round(time.perf_counter() - started, 3))
    cases, repeatable = found["all_rows"]
    return RowResult(
        source=loaded.source, has_backward=adapter.has_backward,
        batch_invariance=bi.verdict(cases, repeatable, found["full_vs_sub_batches"],
                                    found["batch_size_sweep"]),
        accuracy_latency=found["accuracy_latency"],
        wall_s=round(time.perf_counter() - started, 3), probe_wall_s=probe_wall,
        timer=timer_for(request.device),
    )


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


def default_out_path(op: str, device: torch.device, quick: bool) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{op}_{device.type}{'_quick' if quick else ''}_{stamp}.json"
