"""Modes in child processes, and one evidence file out of the parts.

A global mode patches aten for the whole process and reads its environment when CUDA and triton start,
so every mode but `plain` runs as `h3bench run ... --mode NAME --in-process --out PART` in a child process
with the mode's variables set from the start. The children are jobs of the fan-out scheduler
(harness/fanout.py) on the run's one device, one after another. A child that exits non-zero, writes
no part file or outlives its timeout makes its mode `{"unavailable": "<what happened>"}`; the other modes
are unaffected. The parts are merged with harness.merge, which refuses parts measured on different GPUs,
torch builds or plans.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import torch

from h3bench.harness import fanout
from h3bench.harness.modes import ModeSpec, get_mode
from h3bench.harness.request import Observer, RunRequest
from h3bench.harness.schema import ControlResult, ControlSkipped, Evidence, SchemaError, UnavailableMode, load

DEFAULT_TIMEOUT_S = fanout.DEFAULT_JOB_TIMEOUT_S


def child_argv(request: RunRequest, mode: str, part: Path) -> tuple[str, ...]:
    if not request.child_args or not request.child_program:
        raise ValueError(f"mode {mode} runs in a child process: the request must carry child_program (the "
                         "command that starts the program) and child_args (the CLI arguments that select the "
                         "same op, plan and rows)")
    # --force: the part file is the parent's own scratch path, which a retried job writes again
    return (*request.child_program, "run", *request.child_args, "--mode", mode, "--in-process",
            "--out", str(part), "--force", "--no-render", "--quiet")


def device_slot(device: torch.device) -> str:
    """The scheduler's name for the run's device: its CUDA index, or "cpu"."""
    if device.type != "cuda":
        return fanout.CPU
    return str(device.index if device.index is not None else torch.cuda.current_device())


def mode_job(request: RunRequest, spec: ModeSpec, folder: Path, cost_s: float = 1.0) -> fanout.Job:
    """One mode of one request as a fan-out job: a child `h3bench run` writing one part file."""
    part = folder / f"{request.config.op}.{spec.name}.json"
    return fanout.Job(key=f"{request.config.op}/{spec.name}", argv=child_argv(request, spec.name, part), out=part,
                      cost_s=cost_s, timeout_s=request.mode_timeout_s or DEFAULT_TIMEOUT_S,
                      env=dict(spec.environment))  # h3bench itself: the parent's, as installed


def control_job(request: RunRequest, folder: Path, cost_s: float = 1.0) -> fanout.Job:
    """The run's negative control as a fan-out job: a child `h3bench run --control-only` in the plain mode,
    writing a part file with no rows and the `control` record."""
    part = folder / f"{request.config.op}.control.json"
    plain = get_mode("plain")
    argv = (*child_argv(request, plain.name, part), "--control-only")
    return fanout.Job(key=f"{request.config.op}/control", argv=argv, out=part, cost_s=cost_s,
                      timeout_s=request.mode_timeout_s or DEFAULT_TIMEOUT_S, env=dict(plain.environment))


def control_of(outcome: fanout.Outcome) -> ControlResult | ControlSkipped:
    """The control record a control job wrote; a failed job is the control's recorded reason."""
    if not outcome.ok:
        return ControlSkipped(skipped=f"the control's child process: {outcome.error}")
    try:
        record = load(outcome.job.out).control
    except (OSError, SchemaError) as exc:
        return ControlSkipped(skipped=f"the control's child process wrote no valid part file: {exc}")
    if record is None:
        raise RuntimeError(f"the control job {outcome.job.key} wrote no control record")
    return record


def run_modes(request: RunRequest, specs: Sequence[ModeSpec],
              observer: Observer) -> dict[str, Evidence | UnavailableMode]:
    """Each mode's part, measured by a child process on this run's device, one after another; a failed
    child's mode is an UnavailableMode part."""
    if request.device.type == "cuda":
        torch.cuda.empty_cache()  # the children need the memory this process's cache holds
    with tempfile.TemporaryDirectory(prefix="h3bench-modes-", dir=request.work_dir) as tmp:
        jobs = [mode_job(request, spec, Path(tmp)) for spec in specs]
        observer.phase_started("modes", f"{len(jobs)} mode(s) in child processes", len(jobs))
        outcomes = fanout.run_jobs(jobs, [device_slot(request.device)], retries=0,
                                   on_event=lambda e: observer.advance(1) if e.kind in ("finished", "failed") else None)
        observer.phase_finished()
        return {spec.name: part_of(spec, outcome) for spec, outcome in zip(specs, outcomes)}


def part_of(spec: ModeSpec, outcome: fanout.Outcome) -> Evidence | UnavailableMode:
    if not outcome.ok:
        return UnavailableMode(unavailable=f"child process: {outcome.error}")
    try:
        part = load(outcome.job.out)
    except (OSError, SchemaError) as exc:
        return UnavailableMode(unavailable=f"child process wrote no valid part file: {exc}")
    if list(part.results) != [spec.name]:
        raise RuntimeError(f"the child for mode {spec.name} wrote results for {list(part.results)}")
    return part
