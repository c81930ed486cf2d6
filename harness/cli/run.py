"""`h3bench run`: its options, their checks (`check_flags`: one line and exit 2 for a bad one), and the
command, which wires the checked flags to harness's request building and running (harness/commands/)."""
from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from h3bench.cli.common import flag, one_line_errors
from h3bench.harness.commands import ALL_OPS, BadInput, Program, resolve_device
from h3bench.harness.commands.requests import RunOptions
from h3bench.harness.fanout import DEFAULT_JOB_TIMEOUT_S as DEFAULT_CHILD_TIMEOUT_S

# What --out defaults to (harness/runner.py's default_out_path), for the help text.
DEFAULT_OUT = "runs/<op>_<device>_<plan>_<time>.json; several ops: a folder runs/all_..."


def _exclusive(**given: bool) -> None:
    """At most one of the flags of a mutually exclusive set: two are an error, not the last one winning."""
    named = [flag for flag, on in given.items() if on]
    if len(named) > 1:
        raise BadInput(f"{' and '.join(named)} exclude each other: give one")


def check_flags(*, op: str, config: Optional[Path], sets: List[str], quick: bool, full: bool, device: str,
                adapters: Optional[str], externals: List[str], forward_only: bool, modes: List[str],
                out: Optional[str], force: bool, render: bool, quiet: bool, mode_timeout: Optional[float],
                gpus: Optional[str], per_gpu: Optional[int], ray: Optional[str], require_invariant: Optional[str],
                flush_l2: bool, graph_timing: Optional[bool], in_process: bool, no_control: bool,
                control_only: bool) -> RunOptions:
    """The run's flags checked against each other (BadInput, before anything is loaded or measured) and
    resolved: the device, the ops, the plan and where it came from, the modes, the control's place."""
    from h3bench.harness import control as negative_control
    from h3bench.harness.commands.plan import choose_plan
    from h3bench.harness.commands.requests import resolve_ops
    from h3bench.harness.modes import parse_modes

    _exclusive(**{"--quick": quick, "--full": full})
    _exclusive(**{"--gpus": gpus is not None, "--ray": ray is not None})
    _exclusive(**{"--no-control": no_control, "--control-only": control_only})
    if per_gpu is not None and gpus is None:
        raise BadInput(f"--per-gpu {per_gpu}: needs --gpus (it sets how many of the fan-out's jobs share each GPU)")
    if per_gpu is not None and per_gpu < 1:
        raise BadInput(f"--per-gpu {per_gpu}: must be at least 1")
    dev = resolve_device(device)
    ops = resolve_ops(op)
    if mode_timeout is not None and not mode_timeout > 0:
        raise BadInput(f"--mode-timeout {mode_timeout:g}: must be a positive number of seconds")
    if ray is not None and importlib.util.find_spec("ray") is None:
        from h3bench.harness.fanout_ray import RAY_MISSING
        raise BadInput(f"--ray {ray}: {RAY_MISSING}")
    if out and len(ops) == 1 and out.endswith(("/", os.sep)):   # Path() would drop the slash
        raise BadInput(f"--out {out}: names a folder; with one op --out is the evidence file "
                       f"(e.g. {Path(out) / (ops[0] + '.json')})")
    if forward_only and not externals:
        raise BadInput("--forward-only declares --adapter functions without a backward: name one with --adapter")
    if len(ops) > 1 and (config is not None or adapters is not None or externals):
        raise BadInput("--config, --adapters and --adapter name one op's file and rows; with several ops each op "
                       "runs its built-in config and rows")
    try:
        chosen_modes = parse_modes(modes)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if in_process and len(chosen_modes) != 1:
        raise BadInput("--in-process runs exactly one mode")
    if in_process and (gpus is not None or ray is not None):
        raise BadInput("--in-process runs one mode here; it does not fan out")
    if control_only and not in_process:
        raise BadInput("--control-only is how a fan-out runs its control job: it goes with --in-process")
    if flush_l2:  # a plan key like any other: it reaches the recorded config and the modes' children
        sets = [*sets, "timing.flush_l2=true"]
    if graph_timing is not None:
        sets = [*sets, f"timing.graph={'true' if graph_timing else 'false'}"]
    # a mode's child or a fan-out job: the run's parent (or its control job) measures the control
    where = (negative_control.SKIP if no_control else
             negative_control.ELSEWHERE if in_process and not control_only else negative_control.HERE)
    return RunOptions(
        ops=ops, device=dev, plan=choose_plan(quick, full, config, dev.type), config=config, sets=tuple(sets),
        adapters=adapters, externals=tuple(externals), forward_only=forward_only, modes=chosen_modes,
        out=Path(out) if out else None, force=force, render=render, quiet=quiet, mode_timeout=mode_timeout,
        gpus=gpus, per_gpu=per_gpu or 1, ray=ray, require_invariant=require_invariant, in_process=in_process,
        control=where, control_only=control_only, command=shlex.join(["h3bench", *sys.argv[1:]]))


def _interrupted(message: str) -> None:
    from rich.markup import escape

    from h3bench.harness.console import make_console

    make_console(stderr=True).print(f"[yellow]{escape(message)}[/]", highlight=False)
    raise typer.Exit(130)


def run(
    ctx: typer.Context,
    op: str = typer.Option("norm_modulate", "--op", metavar="NAME[,NAME]",
                           help=f"Operator(s) to run, or {ALL_OPS} (the RFC's seven ops; one evidence file per op); a "
                                "user op: PATH.py:ATTR, module:ATTR or an h3bench.ops entry point."),
    config: Optional[Path] = typer.Option(None, "--config", metavar="FILE",
                                          help="TOML config, layered over the op's built-in one; a top-level "
                                               "quick = true or false in it sets the plan.",
                                          show_default="configs/<op>/default.toml, and quick.toml for the quick plan"),
    set_: List[str] = typer.Option([], "--set", metavar="KEY=VALUE", show_default=False,
                                   help="Override a config key: KEY=VALUE or TABLE.KEY=VALUE (repeatable)."),
    quick: bool = flag("--quick", "The quick plan (default on a CPU, unless the --config file sets the plan)."),
    full: bool = flag("--full", "The full plan (default on CUDA, unless the --config file sets the plan)."),
    device: str = typer.Option("auto", "--device", metavar="auto|cuda|cpu", help="Where the rows run."),
    adapters: Optional[str] = typer.Option(None, "--adapters", metavar="ROW[,ROW]|none",
                                           help="Built-in rows to run, or none.",
                                           show_default="every built-in row; on a CPU the torch_compile rows "
                                                        "only when named"),
    adapter: List[str] = typer.Option([], "--adapter", metavar="[NAME=]MODULE:ATTR", show_default=False,
                                      help="Extra implementation, [name=]module:attr or [name=]path/file.py:attr "
                                           "(repeatable); `h3bench list --op NAME` shows the signature it must "
                                           "have."),
    forward_only: bool = flag("--forward-only", "The --adapter functions have no backward."),
    mode: List[str] = typer.Option(["plain"], "--mode", metavar="NAME[,NAME]|all", help="Global mode(s)."),
    out_arg: Optional[str] = typer.Option(None, "--out", metavar="FILE|DIR",
                                          help="Evidence JSON path (a folder with several ops).",
                                          show_default=DEFAULT_OUT),
    force: bool = flag("--force", "Overwrite the evidence file(s) --out names if they exist."),
    render: bool = typer.Option(True, "--render/--no-render", help="Write tables and plots beside the JSON."),
    quiet: bool = flag("--quiet", "No progress (bars on a terminal, a line per row elsewhere)."),
    mode_timeout: Optional[float] = typer.Option(None, "--mode-timeout", metavar="SECONDS",
                                                 help="Seconds a mode's child may run.",
                                                 show_default=f"{DEFAULT_CHILD_TIMEOUT_S:g}"),
    gpus: Optional[str] = typer.Option(None, "--gpus", metavar="N|all|IDS",
                                       help="Fan (op, mode) jobs out over GPUs: N, all, or ids like 0,2,5; one "
                                            "worker per GPU.",
                                       show_default="one process, no fan-out"),
    per_gpu: Optional[int] = typer.Option(
        None, "--per-gpu", metavar="K", show_default="1",
        help="With --gpus: jobs at once on each GPU. Their bitwise probes overlap; the bandwidth, contention "
             "and latency measurements take turns, each alone on the GPU."),
    ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS|auto", show_default="no Ray",
                                      help="Run the (op, mode) jobs as Ray tasks (num_gpus=1): a cluster "
                                           "address, or auto."),
    require_invariant: Optional[str] = typer.Option(
        None, "--require-invariant", metavar="ROW[,ROW]|all", show_default="no gate",
        help="Exit 1, naming each, when a selected row is not batch-invariant, its parameter gradients do not "
             "repeat, or it is unavailable (for CI)."),
    flush_l2: bool = flag("--flush-l2", "Zero a 256 MiB buffer before each synchronized and graph sample, "
                                        "outside its timing: every sample starts with a cold L2 (sets [timing] "
                                        "flush_l2)."),
    graph_timing: Optional[bool] = typer.Option(
        None, "--graph-timing/--no-graph-timing", show_default="the config's [timing] graph: on",
        help="Also time each figure's step as a CUDA-graph replay on CUDA (*_graph_us; sets [timing] graph; a "
             "CPU has no graphs)."),
    in_process: bool = flag("--in-process", "Run the one mode in this process (how a mode's child is called).",
                            hidden=True),
    no_control: bool = flag("--no-control", "Skip the negative control (recorded in the file)."),
    control_only: bool = flag("--control-only", "Measure the negative control alone (a fan-out's control job).",
                              hidden=True),
):
    """Run every selected implementation through the probes and write the evidence JSON.

    Every run also puts a negative control through the batch-invariance probes, once per op in the plain
    mode: the op's composition (its diffusers or torch row) with a planted batch-size fault, which the plan
    must flag. It is recorded under the file's `control` key, not as a row; --no-control skips it.

    Exit status: 0; 1 when --require-invariant fails; 2 on bad input; 3 when the plan is blind on this
    machine (the control went unflagged by a check: the file is written and says so); 130 when interrupted
    (Ctrl-C: nothing is written for the op it stopped).
    """
    from h3bench.harness.commands.requests import build_requests, required_rows
    from h3bench.harness.commands.run import Interrupted, execute

    program = ctx.find_object(Program)
    try:
        with one_line_errors():
            options = check_flags(
                op=op, config=config, sets=set_, quick=quick, full=full, device=device, adapters=adapters,
                externals=adapter, forward_only=forward_only, modes=mode, out=out_arg, force=force, render=render,
                quiet=quiet, mode_timeout=mode_timeout, gpus=gpus, per_gpu=per_gpu, ray=ray,
                require_invariant=require_invariant, flush_l2=flush_l2, graph_timing=graph_timing,
                in_process=in_process, no_control=no_control, control_only=control_only)
            requests = build_requests(options, program)
            required = required_rows(options.require_invariant, requests)
            code = execute(options, requests, required, program)
    except Interrupted as exc:
        _interrupted(str(exc))
    except KeyboardInterrupt:
        _interrupted("interrupted before the run started; nothing was written")
    raise typer.Exit(code)
