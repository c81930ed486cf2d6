"""`h3bench run` once its requests are built (harness/commands/requests.py): the requests run here, one op
after another with a header line, progress and a summary each, or fanned out over GPUs or Ray; then the
renderings, the `wrote` line and the gate. Returns the exit status: 0; 1 when --require-invariant fails; 3
when the plan is blind on this machine. A run interrupted (Ctrl-C) or failed leaves no file it made for the
ops it did not finish (harness/commands/outputs.py); Ctrl-C is `Interrupted`, whose message says what."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Sequence

from rich.console import Console

from h3bench.harness.commands import BadInput, Program
from h3bench.harness.commands.outputs import RunOutputs
from h3bench.harness.commands.requests import RunOptions
from h3bench.harness.console import make_console, say, table_console


class Interrupted(Exception):
    """Ctrl-C stopped the run; the message says what it stopped and what was kept (one line)."""


def execute(options: RunOptions, requests: Sequence, required, program: Program) -> int:
    from h3bench.harness import control as negative_control
    from h3bench.harness import gpu_turns
    from h3bench.harness.ops.declared import UserOpError

    # --quiet hides progress only: the summary, the "wrote" line and errors still print
    console = make_console(stderr=True)
    outputs = RunOutputs([r.out for r in requests])
    try:
        outputs.make_folders()
        if options.fans_out:
            found = _fan_out(requests, options, console)
            for request in requests:
                outputs.finish(request.out)
        else:
            found = _run_here(requests, options, console, outputs)
        written = [r.out for r in requests]
        if options.render:
            for hook in program.render_hooks:
                written += hook([r.out for r in requests], console)
    except KeyboardInterrupt:
        outputs.take_back()
        raise Interrupted(_interrupted(outputs, {r.out: r.config.op for r in requests})) from None
    except UserOpError as exc:  # a user op's own code failed mid-run (its make_inputs, its reference)
        outputs.take_back()
        raise BadInput(str(exc)) from None
    except BaseException:
        outputs.take_back()
        raise
    texts = [str(p) for p in written]
    say(console, f"wrote {', '.join(texts)}", whole=texts)
    if gpu_turns.sharing():  # a fan-out's job on a shared GPU: its turns, for the parent's finish line
        print(gpu_turns.summary(), file=sys.stderr, flush=True)
    # a fan-out's control job reports to its parent through its part file, not its exit status
    blind = not options.in_process and any(negative_control.blind(evidence) for evidence in found)
    passed = required is None or _gate([r.out for r in requests], required, console)
    return negative_control.BLIND_EXIT if blind else 0 if passed else 1


def _interrupted(outputs: RunOutputs, ops: dict) -> str:
    """The interrupt's line: the op it stopped (or the fan-out's ops), that nothing of it was written, and the
    finished ops' files that stay."""
    kept = ", ".join(str(p) for p in outputs.finished)
    if not outputs.unfinished:
        return f"interrupted while rendering; the evidence is written whole: {kept}"
    stopped = [ops[outputs.current]] if outputs.current is not None else [ops[p] for p in outputs.unfinished]
    return (f"interrupted while running {', '.join(stopped)}; nothing was written"
            + (f" for {'it' if len(stopped) == 1 else 'them'} (the finished ops' files stay: {kept})" if kept else ""))


def header(request, plan) -> str:
    cfg = request.config
    return (f"h3bench: op {cfg.op}, device {request.device}, {plan.describe()}, modes {', '.join(request.modes)}, "
            f"rows {', '.join(a.name for a in request.adapters)}"
            f"{'; Triton under the interpreter' if os.environ.get('TRITON_INTERPRET') == '1' else ''}")


def _run_here(requests: Sequence, options: RunOptions, console: Console, outputs: RunOutputs) -> list:
    """Each request run in this process, its summary printed; returns the evidence of each."""
    from h3bench.harness.progress import PlainObserver, RichObserver, summary_table
    from h3bench.harness.runner import run as run_evidence

    found = []
    for request in requests:
        cfg = request.config
        outputs.current = request.out
        say(console, header(request, options.plan), whole=[options.plan.source])
        started = time.perf_counter()
        if options.quiet:
            evidence = run_evidence(request)
        elif console.is_terminal:
            with RichObserver(console) as observer:
                evidence = run_evidence(request, observer)
        else:  # a pipe, a CI log: a plain line as each row finishes, not a bar redrawn nowhere
            evidence = run_evidence(request, PlainObserver(console, cfg.op))
        outputs.finish(request.out)
        outputs.current = None
        table_console().print(summary_table(evidence))
        print_control(evidence, console)
        console.print(f"{cfg.op}: finished in {time.perf_counter() - started:.1f} s", highlight=False)
        found.append(evidence)
    return found


def print_control(evidence, console: Console) -> None:
    """The run's one line on its negative control (harness/control.py)."""
    from h3bench.harness import control as negative_control
    from h3bench.harness.schema import ControlSkipped

    line = negative_control.summary_line(evidence)
    if line is None:
        return
    style = ("red" if negative_control.blind(evidence) else
             "yellow" if isinstance(evidence.control, ControlSkipped) else "")
    say(console, line, style=style)


def _fan_out(requests: Sequence, options: RunOptions, console: Console) -> list:
    from h3bench.harness import control as negative_control
    from h3bench.harness import fanout
    from h3bench.harness.progress import summary_table
    from h3bench.harness.suite import run_suite

    devices: list[str] = []
    if options.ray is None:
        import torch

        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        try:
            devices = fanout.parse_gpus(options.gpus, available)
        except ValueError as exc:
            raise BadInput(str(exc)) from None   # parse_gpus's messages name --gpus and its value themselves

    started = time.perf_counter()

    def show(event: fanout.Event) -> None:
        # each line with the seconds since the fan-out began: a log read afterwards has the jobs' timeline
        where = f"GPU {event.device}" if event.device not in (None, fanout.CPU) else "the CPU"
        turns = f" ({event.message})" if event.kind == "finished" and event.message else ""
        text = {"started": f"started on {where} (attempt {event.attempt})",
                "finished": f"finished on {where} in {event.wall_s:.0f} s{turns}",
                "retrying": f"failed on {where}, retrying elsewhere: {event.message}",
                "failed": f"FAILED: {event.message}"}.get(event.kind, event.kind)
        say(console, f"[{time.perf_counter() - started:5.0f} s] {event.key}: {text}")

    found = run_suite(requests, devices, ray_address=options.ray, on_event=show, per_device=options.per_gpu)
    for evidence in found:
        table_console().print(summary_table(evidence))
        print_control(evidence, console)
    jobs = sum(len(r.modes) + (r.control == negative_control.HERE) for r in requests)  # a control job per op
    workers = len(devices) * options.per_gpu if devices else "Ray"
    console.print(f"{len(found)} op(s), {jobs} job(s) in "
                  f"{time.perf_counter() - started:.1f} s on {workers} worker(s)")
    return found


def _gate(paths: list[Path], selection, console: Console) -> bool:
    """--require-invariant's verdict over the written files, printed: every failed check of a selected row,
    then the rows judged; True when every selected row passed."""
    from h3bench.harness import gate
    from h3bench.harness.schema import load

    verdict = gate.judge([load(path) for path in paths], selection)
    for line in verdict.failures:
        say(console, line, style="red", label="required invariance failed:")
    judged = ", ".join(verdict.judged) or "none"
    if not verdict.passed:
        say(console, f"required invariance: FAILED; rows judged: {judged}")
        return False
    say(console, f"required invariance: every selected row is batch-invariant with repeatable parameter "
                 f"gradients; rows judged: {judged}")
    return True
