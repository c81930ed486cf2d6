"""h3bench's measuring commands (run, list, env, validate): parse, build the request, call the runner.

harness/ imports neither adapters/ nor reports/ (data flows one way): `make_app(program)` builds the
commands around what the program's composition root (reports/cli.py) hands in, a `Program`: the built-in
adapter registry, the control's composition, the renderers `run` calls after writing its JSON, and the
command that starts the program again in a child process. The commands read it from the click context.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import tempfile
import time
from importlib import metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import typer
from rich.console import Console
from rich.markup import escape

from h3bench.harness import gpu_turns
from h3bench.harness.console import make_console
from h3bench.harness.fanout import DEFAULT_JOB_TIMEOUT_S as DEFAULT_CHILD_TIMEOUT_S

err = make_console(stderr=True)
ENTRY_POINT_GROUP = "h3bench.adapters"
ALL_OPS = "all"
HELP = "Batch-invariance, accuracy and latency evidence for GPU kernels."
# What --out defaults to (harness/runner.py's default_out_path), for the help text.
DEFAULT_OUT = "runs/<op>_<device>_<plan>_<time>.json; several ops: a folder runs/all_..."

# Tables piped (`| cat`, a CI log) stay this wide: `list` and the run's summary fold long reasons onto more
# lines, never cut; names keep their width.
PIPED_TABLE_WIDTH = 160

# Called after a run with the written evidence paths and the console; each returns the files it wrote.
RenderHook = Callable[[list[Path], Console], list[Path]]


@dataclass(frozen=True)
class Program:
    """What the measuring commands get from the program's composition root instead of importing it."""

    builtin_adapters: Callable[[str], list]          # an op's built-in rows (Adapter), in registry order
    control_adapter: Callable[[str], Optional[object]]  # the op's row the control plants its fault in, or None
    child_program: tuple[str, ...]                   # the command that starts this program in a child process
    render_hooks: Sequence[RenderHook] = ()          # Markdown/HTML/plots per file, an index page for several


def make_app(program: Program) -> typer.Typer:
    """The measuring commands as a typer app, each reading `program` from its click context; the caller
    adds its own commands to it."""
    # A harness error's traceback: rich's panel at a terminal; Python's own anywhere else, where its last
    # line is the whole exception (rich wraps it to the log's width, and a fan-out's failure reason is
    # that last line: harness/fanout.py).
    app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP,
                      pretty_exceptions_enable=sys.stderr.isatty(),
                      context_settings={"help_option_names": ["-h", "--help"], "obj": program})
    app.callback()(_options)
    app.command()(run)
    app.command("list")(list_)
    app.command()(env)
    app.command()(validate)
    return app


def _table_console() -> Console:
    """Stdout for a table: a terminal's width, else PIPED_TABLE_WIDTH."""
    console = make_console()
    return console if console.is_terminal else Console(width=PIPED_TABLE_WIDTH, soft_wrap=False)


def _program(ctx: typer.Context) -> Program:
    return ctx.find_object(Program)


def _print_version(value: bool) -> None:
    if value:
        try:
            version = metadata.version("h3bench")
        except metadata.PackageNotFoundError:  # a checkout on PYTHONPATH (tools/link_package.sh), not installed
            version = "not installed"
        print(f"h3bench {version}")
        raise typer.Exit()


def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, metavar="",
                                          help="Print h3bench's version and exit.")) -> None:
    """Batch-invariance, accuracy and latency evidence for GPU kernels."""


def fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def _device(name: str):
    """Resolve the device; on a CPU, run Triton rows under the interpreter (must precede its import)."""
    from h3bench.harness.runner import resolve_device

    try:
        device = resolve_device(name)
    except ValueError as exc:
        fail(str(exc))
    if device.type == "cpu" and "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    return device


_WARNED: set = set()


def _entry_point_adapters(op: str) -> dict:
    """Adapters registered by installed packages in the `h3bench.adapters` entry-point group: an Adapter
    object (it names its op), or a plain function whose entry-point name is `<op>.<row>`."""
    from h3bench.harness.adapter import Adapter, load_external, unavailable_adapter
    from h3bench.harness.execute import describe_exception
    from h3bench.harness.ops import get_op

    found = {}
    spec = get_op(op)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        target_op, _, row = ep.name.partition(".")
        try:
            obj = ep.load()
            if isinstance(obj, Adapter):
                if obj.op == op:
                    found.setdefault(obj.name, obj)
            elif target_op == op and row:
                adapter = load_external(ep.value, op=op, differentiable=spec.differentiable,
                                        n_inputs=len(spec.inputs), constants=spec.constants)
                found.setdefault(row, dataclasses.replace(adapter, name=row))  # the row its entry point names
        except Exception as exc:  # another package's broken entry point is its row's reason, not our crash
            reason = f"entry point {ep.name} = {ep.value}: {describe_exception(exc)}"
            if target_op == op and row:
                found.setdefault(row, unavailable_adapter(row, op, spec.differentiable, reason))
            elif not row and (ep.name, op) not in _WARNED:  # no op in its name: it cannot be given a row
                _WARNED.add((ep.name, op))
                err.print(f"[yellow]warning:[/] {escape(reason)} (skipped)", highlight=False)
    return found


def named_adapters(program: Program, op: str) -> dict:
    named = {a.name: a for a in program.builtin_adapters(op)}
    for name, adapter in _entry_point_adapters(op).items():
        if name in named:  # the name keeps meaning the built-in row, and says so: no silent stand-in
            if (name, op, "clash") not in _WARNED:
                _WARNED.add((name, op, "clash"))
                err.print(f"[yellow]warning:[/] {escape(f'an installed package registers a row {name} for {op}, a built-in row name; the built-in row keeps it (skipped)')}", highlight=False)
            continue
        named[name] = adapter
    return named


def _select_adapters(program: Program, op: str, selection: Optional[str], externals: List[str],
                     forward_only: bool = False) -> list:
    from h3bench.harness.adapter import load_external
    from h3bench.harness.ops import get_op

    named = named_adapters(program, op)
    if selection is None:
        chosen = list(named.values())
    elif selection.strip() == "none":
        chosen = []
    else:
        wanted = [s.strip() for s in selection.split(",") if s.strip()]
        unknown = [w for w in wanted if w not in named]
        if unknown:
            fail(f"unknown adapter(s) {', '.join(unknown)} for op {op}; known: {', '.join(named)}")
        chosen = [named[w] for w in wanted]
    spec = get_op(op)
    for text in externals:
        try:
            adapter = load_external(text, op=op, differentiable=spec.differentiable, n_inputs=len(spec.inputs),
                                    constants=spec.constants, forward_only=forward_only)
        except ValueError as exc:
            fail(str(exc))
        taken = next((a for a in chosen if a.name == adapter.name), None)
        if taken is not None:  # a renamed row would leave the name, and the gate, to the other one
            builtin = named.get(taken.name) is taken
            target = text.partition("=")[2] if "=" in text else text
            fail(f"--adapter {text}: the row name {adapter.name} is taken by "
                 + (f"the built-in row; name yours (--adapter NAME={target}) or leave the built-in out "
                    f"(--adapters without {adapter.name})" if builtin else
                    "another --adapter; give each its own name (--adapter NAME=module:attr)"))
        chosen.append(adapter)
    if not chosen:
        fail("no adapters selected: name some with --adapters or --adapter module:attr")
    return chosen


def _check_writable(path: Path) -> None:
    if path.exists() and path.is_dir():
        fail(f"--out {path}: is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".h3bench-probe-"):
            pass
    except OSError as exc:
        fail(f"--out {path}: cannot write there ({exc.strerror or exc})")


def _ops(op: str) -> list[str]:
    """`--op NAME[,NAME]` or `--op all`, in the order given (all: the RFC's suite, `all_ops`); a NAME may be a user's op
    (harness/op_source.py: PATH.py:ATTR, module:ATTR, an h3bench.ops entry point)."""
    from h3bench.harness import op_source
    from h3bench.harness.ops import OP_MODULES, all_ops

    names = [n.strip() for n in op.split(",") if n.strip()]
    if ALL_OPS in names:
        return all_ops()
    if not names:
        fail(f"unknown op {op!r}; known ops: {', '.join(OP_MODULES)}, or {ALL_OPS}; {op_source.FORMS}")
    try:
        return list(dict.fromkeys(op_source.resolve(n).name for n in names))
    except ValueError as exc:
        fail(str(exc))


def _child_args(op: str, device, config: Optional[Path], sets: List[str], quick: bool,
                selection: Optional[str], externals: List[str], forward_only: bool = False) -> tuple[str, ...]:
    """The arguments that make a mode's child process run the same op, plan and rows."""
    from h3bench.harness.op_source import spec_of

    args = ["--op", spec_of(op), "--device", device.type, "--quick" if quick else "--full"]
    if forward_only:
        args.append("--forward-only")
    if selection is not None:
        args += ["--adapters", selection]
    if config is not None:
        args += ["--config", str(config)]
    for item in sets:
        args += ["--set", item]
    for text in externals:
        args += ["--adapter", text]
    return tuple(args)


def refuse_overwrite(paths: list[Path], force: bool, flag: str) -> None:
    """Files the user pointed an output option at are not overwritten silently: without --force it is an
    error (a default path is timestamped and never collides). `report`, `compare` and `merge` use it too."""
    existing = [str(p) for p in paths if Path(p).is_file()]
    if existing and not force:
        fail(f"{flag}: {', '.join(existing)} {'exists' if len(existing) == 1 else 'exist'}; "
             f"pass --force to overwrite")


def _exclusive(**given: bool) -> None:
    """At most one of the flags of a mutually exclusive set: two are an error, not the last one winning."""
    named = [flag for flag, on in given.items() if on]
    if len(named) > 1:
        fail(f"{' and '.join(named)} exclude each other: give one")


def run(
    ctx: typer.Context,
    op: str = typer.Option("norm_modulate", "--op", help=f"Operator(s) to run: NAME[,NAME], or {ALL_OPS} "
                                                         "(the RFC's seven ops; one evidence file per op); a user op: PATH.py:ATTR, "
                                                         "module:ATTR or an h3bench.ops entry point."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML config.",
                                          show_default="the op's built-in configs/<op>/default.toml"),
    set_: List[str] = typer.Option([], "--set", help="Override a config key: KEY=VALUE or TABLE.KEY=VALUE "
                                                     "(repeatable).", show_default=False),
    quick: bool = typer.Option(False, "--quick", metavar="", show_default=False,
                               help="The quick plan (default on a CPU)."),
    full: bool = typer.Option(False, "--full", metavar="", show_default=False,
                              help="The full plan (default on CUDA, or with --config)."),
    device: str = typer.Option("auto", "--device", help="auto, cuda or cpu."),
    adapters: Optional[str] = typer.Option(None, "--adapters", help="Built-in rows to run (a,b), or none.",
                                           show_default="every built-in row; on a CPU the torch_compile rows "
                                                        "only when named"),
    adapter: List[str] = typer.Option([], "--adapter", show_default=False,
                                      help="Extra implementation \\[name=]module:attr or \\[name=]path/file.py:attr "
                                           "(repeatable); `h3bench list --op NAME` shows the signature it must "
                                           "have."),
    forward_only: bool = typer.Option(False, "--forward-only", metavar="", show_default=False,
                                      help="The --adapter functions have no backward."),
    mode: List[str] = typer.Option(["plain"], "--mode", help="Global mode(s): NAME[,NAME], or all."),
    out_arg: Optional[str] = typer.Option(None, "--out", help="Evidence JSON path (a folder with several ops).",
                                          show_default=DEFAULT_OUT),
    force: bool = typer.Option(False, "--force", metavar="", show_default=False,
                               help="Overwrite the evidence file(s) --out names if they exist."),
    render: bool = typer.Option(True, "--render/--no-render", metavar="",
                                help="Write tables and plots beside the JSON."),
    quiet: bool = typer.Option(False, "--quiet", metavar="", show_default=False,
                               help="No progress (bars on a terminal, a line per row elsewhere)."),
    mode_timeout: Optional[float] = typer.Option(None, "--mode-timeout", help="Seconds a mode's child may run.",
                                                 show_default=f"{DEFAULT_CHILD_TIMEOUT_S:g}"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Fan (op, mode) jobs out over GPUs: N, all, or "
                                                            "ids like 0,2,5; one worker per GPU.",
                                       show_default="one process, no fan-out"),
    per_gpu: Optional[int] = typer.Option(
        None, "--per-gpu", show_default="1",
        help="With --gpus: jobs at once on each GPU. Their bitwise probes overlap; the bandwidth, contention "
             "and latency measurements take turns, each alone on the GPU."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Run the (op, mode) jobs as Ray tasks (num_gpus=1): "
                                                          "a cluster address, or auto.", show_default="no Ray"),
    require_invariant: Optional[str] = typer.Option(
        None, "--require-invariant", show_default="no gate",
        help="ROW[,ROW] or all: exit 1, naming each, when a selected row is not batch-invariant, its parameter "
             "gradients do not repeat, or it is unavailable (for CI)."),
    flush_l2: bool = typer.Option(False, "--flush-l2", metavar="", show_default=False,
                                  help="Zero a 256 MiB buffer before each synchronized and graph sample, outside "
                                       "its timing: every sample starts with a cold L2 (sets \\[timing] flush_l2)."),
    graph_timing: Optional[bool] = typer.Option(
        None, "--graph-timing/--no-graph-timing", metavar="", show_default="the config's [timing] graph: on",
        help="Also time each figure's step as a CUDA-graph replay on CUDA (*_graph_us; sets \\[timing] graph; a "
             "CPU has no graphs)."),
    in_process: bool = typer.Option(False, "--in-process", hidden=True,
                                    help="Run the one mode in this process (how a mode's child is called)."),
    no_control: bool = typer.Option(False, "--no-control", metavar="", show_default=False,
                                    help="Skip the negative control (recorded in the file)."),
    control_only: bool = typer.Option(False, "--control-only", hidden=True,
                                      help="Measure the negative control alone (a fan-out's control job)."),
):
    """Run every selected implementation through the probes and write the evidence JSON.

    Every run also puts a negative control through the batch-invariance probes, once per op in the plain
    mode: the op's composition (its diffusers or torch row) with a planted batch-size fault, which the plan
    must flag. It is recorded under the file's `control` key, not as a row; `--no-control` skips it.

    Exit status: 0; 1 when --require-invariant fails; 2 on bad input; 3 when the plan is blind on this
    machine (the control went unflagged by a check: the file is written and says so).
    """
    from h3bench.harness import control as negative_control
    from h3bench.harness import op_source
    from h3bench.harness.config import ConfigError, load_config
    from h3bench.harness.modes import parse_modes
    from h3bench.harness.ops.declared import UserOpError
    from h3bench.harness.runner import RunRequest, default_out_path
    from h3bench.harness.runner import run as run_evidence

    program = _program(ctx)
    _exclusive(**{"--quick": quick, "--full": full})
    _exclusive(**{"--gpus": gpus is not None, "--ray": ray is not None})
    _exclusive(**{"--no-control": no_control, "--control-only": control_only})
    if per_gpu is not None:
        if gpus is None:
            fail(f"--per-gpu {per_gpu}: needs --gpus (it sets how many of the fan-out's jobs share each GPU)")
        if per_gpu < 1:
            fail(f"--per-gpu {per_gpu}: must be at least 1")
    dev = _device(device)
    ops = _ops(op)
    if flush_l2:  # a plan key like any other: it reaches the recorded config and the modes' children
        set_ = [*set_, "timing.flush_l2=true"]
    if graph_timing is not None:
        set_ = [*set_, f"timing.graph={'true' if graph_timing else 'false'}"]
    if mode_timeout is not None and not mode_timeout > 0:
        fail(f"--mode-timeout {mode_timeout:g}: must be a positive number of seconds")
    if ray is not None:
        import importlib.util

        from h3bench.harness.fanout_ray import RAY_MISSING
        if importlib.util.find_spec("ray") is None:
            fail(f"--ray {ray}: {RAY_MISSING}")
    out = Path(out_arg) if out_arg else None
    if out_arg and len(ops) == 1 and out_arg.endswith(("/", os.sep)):   # Path() would drop the slash
        fail(f"--out {out_arg}: names a folder; with one op --out is the evidence file "
             f"(e.g. {out / (ops[0] + '.json')})")
    if forward_only and not adapter:
        fail("--forward-only declares --adapter functions without a backward: name one with --adapter")
    if len(ops) > 1 and (config is not None or adapters is not None or adapter):
        fail("--config, --adapters and --adapter name one op's file and rows; with several ops each op runs "
             "its built-in config and rows")
    try:
        modes = parse_modes(mode)
    except ValueError as exc:
        fail(str(exc))
    if in_process and len(modes) != 1:
        fail("--in-process runs exactly one mode")
    if control_only and not in_process:
        fail("--control-only is how a fan-out runs its control job: it goes with --in-process")
    # a mode's child or a fan-out job: the run's parent (or its control job) measures the control
    where = (negative_control.SKIP if no_control else
             negative_control.ELSEWHERE if in_process and not control_only else negative_control.HERE)
    plan_given = quick or full
    plan_quick = quick if plan_given else (config is None and dev.type == "cpu")
    requests = []
    for name in ops:
        try:
            cfg = load_config(name, config, plan_quick, tuple(set_))
            op_source.check(name, cfg.inputs, dev)  # a user op's own mistakes, named before anything runs
        except (ConfigError, ValueError) as exc:
            fail(f"{name}: {exc}" if len(ops) > 1 else str(exc))
        chosen = _select_adapters(program, name, adapters, adapter, forward_only)
        if adapters is None:  # the default rows: on a CPU, those too costly for it run only when named
            from h3bench.harness.adapter import as_default_row
            chosen = [as_default_row(a, dev) for a in chosen]
        requests.append(RunRequest(
            config=cfg, device=dev, adapters=chosen, modes=modes, out=None,
            command=shlex.join(["h3bench", *sys.argv[1:]]), mode_timeout_s=mode_timeout, in_process=in_process,
            control=where, control_only=control_only, control_adapter=program.control_adapter(name),
            child_program=program.child_program,
            child_args=_child_args(name, dev, config, set_, cfg.quick, adapters, adapter, forward_only)))
    folder = None
    if len(ops) > 1:
        if out is not None and (out.suffix.lower() == ".json" or out.is_file()):
            fail(f"--out {out}: with several ops --out names a folder (one evidence file per op goes in it)")
        folder = out or default_out_path(ALL_OPS, dev, requests[0].config.quick).with_suffix("")
        for request in requests:
            request.out = folder / f"{request.config.op}.json"
    else:
        requests[0].out = out or default_out_path(ops[0], dev, requests[0].config.quick)
    for request in requests:
        _check_writable(request.out)
        if out is not None:
            refuse_overwrite([request.out], force, "--out")
    required = _required(require_invariant, requests)
    # --quiet hides progress only: the summary, the "wrote" line and errors still print
    console = make_console(stderr=True)
    if gpus is not None or ray is not None:
        if in_process:
            fail("--in-process runs one mode here; it does not fan out")
        found = _fan_out(requests, gpus, ray, console, per_gpu or 1)
    else:
        try:
            found = _run_requests(requests, console, quiet, run_evidence, plan_note=not plan_given)
        except UserOpError as exc:  # a user op's own code failed mid-run (its make_inputs, its reference)
            fail(str(exc))
    written = [r.out for r in requests]
    # a fan-out's control job reports to its parent through its part file, not its exit status
    blind = not in_process and any(negative_control.blind(evidence) for evidence in found)
    if render:
        for hook in program.render_hooks:
            written += hook([r.out for r in requests], console)
    console.print(f"wrote {escape(', '.join(str(p) for p in written))}", highlight=False)
    if gpu_turns.sharing():  # a fan-out's job on a shared GPU: its turns, for the parent's finish line
        print(gpu_turns.summary(), file=sys.stderr, flush=True)
    if required is not None:
        _gate([r.out for r in requests], required, exit_after=not blind)
    if blind:
        raise typer.Exit(negative_control.BLIND_EXIT)


def _required(text: Optional[str], requests):
    """--require-invariant's selection, checked against the rows the run will have before anything runs."""
    from h3bench.harness import gate

    if text is None:
        return None
    try:
        selection = gate.parse_selection(text)
    except ValueError as exc:
        fail(str(exc))
    rows = {a.name for r in requests for a in r.adapters}
    unknown = gate.unknown_rows(selection, rows)
    if unknown:
        fail(f"--require-invariant names row(s) this run does not have: {', '.join(unknown)}; "
             f"rows: {', '.join(sorted(rows))}")
    return selection


def _gate(paths: list[Path], selection, exit_after: bool = True) -> None:
    """Exit 1 naming every selected row that breaks the reuse rule (unless a blind plan's exit status
    follows); print the verdict either way."""
    from h3bench.harness import gate
    from h3bench.harness.schema import load

    verdict = gate.judge([load(path) for path in paths], selection)
    for line in verdict.failures:
        err.print(f"[red]required invariance failed:[/] {escape(line)}", highlight=False)
    judged = ", ".join(verdict.judged) or "none"
    if not verdict.passed:
        err.print(f"required invariance: FAILED; rows judged: {escape(judged)}", highlight=False)
        if exit_after:
            raise typer.Exit(1)
        return
    err.print(f"required invariance: every selected row is batch-invariant with repeatable parameter "
              f"gradients; rows judged: {escape(judged)}", highlight=False)


def _run_requests(requests, console: Console, quiet: bool, run_evidence, plan_note: bool) -> list:
    """Each request run here, its summary printed; returns the evidence of each."""
    from h3bench.harness.progress import PlainObserver, RichObserver, summary_table

    found = []
    for request in requests:
        cfg = request.config
        console.print(f"h3bench: op {cfg.op}, device {request.device}, plan {'quick' if cfg.quick else 'full'}"
                      f"{' (CPU default; --full for the full plan)' if plan_note and cfg.quick else ''}, "
                      f"modes {', '.join(request.modes)}, rows {', '.join(a.name for a in request.adapters)}"
                      f"{'; Triton under the interpreter' if os.environ.get('TRITON_INTERPRET') == '1' else ''}")
        started = time.perf_counter()
        if quiet:
            evidence = run_evidence(request)
        elif console.is_terminal:
            with RichObserver(console) as observer:
                evidence = run_evidence(request, observer)
        else:  # a pipe, a CI log: a plain line as each row finishes, not a bar redrawn nowhere
            evidence = run_evidence(request, PlainObserver(console, cfg.op))
        _table_console().print(summary_table(evidence))
        _print_control(evidence, console)
        console.print(f"{cfg.op}: finished in {time.perf_counter() - started:.1f} s", highlight=False)
        found.append(evidence)
    return found


def _print_control(evidence, console: Console) -> None:
    """The run's one line on its negative control (harness/control.py)."""
    from h3bench.harness import control as negative_control
    from h3bench.harness.schema import ControlSkipped

    line = negative_control.summary_line(evidence)
    if line is None:
        return
    style = ("red" if negative_control.blind(evidence) else
             "yellow" if isinstance(evidence.control, ControlSkipped) else "")
    console.print(f"[{style}]{escape(line)}[/]" if style else escape(line), highlight=False)


def _fan_out(requests, gpus: Optional[str], ray: Optional[str], console: Console, per_gpu: int = 1) -> list:
    from h3bench.harness import control as negative_control
    from h3bench.harness import fanout
    from h3bench.harness.progress import summary_table
    from h3bench.harness.suite import run_suite

    devices: list[str] = []
    if ray is None:
        import torch

        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        try:
            devices = fanout.parse_gpus(gpus, available)
        except ValueError as exc:
            fail(str(exc))   # parse_gpus's messages name --gpus and its value themselves

    started = time.perf_counter()

    def show(event: fanout.Event) -> None:
        # each line with the seconds since the fan-out began: a log read afterwards has the jobs' timeline
        where = f"GPU {event.device}" if event.device not in (None, fanout.CPU) else "the CPU"
        turns = f" ({event.message})" if event.kind == "finished" and event.message else ""
        text = {"started": f"started on {where} (attempt {event.attempt})",
                "finished": f"finished on {where} in {event.wall_s:.0f} s{turns}",
                "retrying": f"failed on {where}, retrying elsewhere: {event.message}",
                "failed": f"FAILED: {event.message}"}.get(event.kind, event.kind)
        console.print(escape(f"[{time.perf_counter() - started:5.0f} s] {event.key}: {text}"), highlight=False)

    found = run_suite(requests, devices, ray_address=ray, on_event=show, per_device=per_gpu)
    for evidence in found:
        _table_console().print(summary_table(evidence))
        _print_control(evidence, console)
    jobs = sum(len(r.modes) + (r.control == negative_control.HERE) for r in requests)  # a control job per op
    workers = len(devices) * per_gpu if devices else "Ray"
    console.print(f"{len(found)} op(s), {jobs} job(s) in "
                  f"{time.perf_counter() - started:.1f} s on {workers} worker(s)")
    return found


def _dims(shape: tuple[str, ...]) -> str:
    return f"[{', '.join(shape)}]" if shape else "[?]"


def signature(op: str) -> str:
    """The call an external function must accept for `op`: the formula, inputs in order with their shapes
    (R: the batch's rows), dtypes and roles (per row or shared, which get gradients), the outputs it returns,
    and the constants it may take as keyword arguments, with their defaults."""
    import dataclasses

    import torch

    from h3bench.harness.config import load_config
    from h3bench.harness.ops import get_op

    spec = get_op(op)
    params = load_config(op).inputs
    # dtypes from a small batch of the quick plan (same dtypes, small tensors); sizes from the default config
    small = load_config(op, quick=True).inputs
    tensors = spec.make_inputs(small, 2, 0, torch.device("cpu")).tensors
    outs = spec.make_grad_outs(small, 2, 0, torch.device("cpu"))
    dtype = lambda t: str(t.dtype).replace("torch.", "")  # noqa: E731
    constants = ", ".join(f"{c}={getattr(params, c)!r}" for c in spec.constants)
    outputs = ", ".join(spec.outputs)
    lines = [f"def my_{op}({', '.join(spec.input_names)}{', *, ' + constants if constants else ''}):  # -> "
             f"{outputs if len(spec.outputs) == 1 else '(' + outputs + ')'}"]
    if spec.formula:
        lines.append(f"    {spec.formula}")
    # an op that declares no shapes in words (a user's op may not) shows a 2-row case's at its quick config
    shown = {i.name: _dims(i.shape) if i.shape else str(list(tensors[i.name].shape)) for i in spec.inputs}
    width = max(len(text) for text in shown.values())
    lines.append("  inputs, in call order (R: the rows of the batch):")
    for i in spec.inputs:
        role = "per row (dim 0 is the row)" if i.per_row else "shared by every row"
        lines.append(f"    {i.name:<6} {shown[i.name]:<{width}}  {dtype(tensors[i.name]):<8}  {role}; "
                     f"{'gets a gradient' if i.differentiable else 'no gradient'}")
    lines.append("  returns (the contract: another shape, dtype or device makes the row unavailable):")
    shapes = spec.output_shapes or [()] * len(spec.outputs)
    for name, shape, g in zip(spec.outputs, shapes, outs):
        lines.append(f"    {name:<6} {_dims(shape) if shape else str(list(g.shape))}  {dtype(g)}")
    if not all(i.shape for i in spec.inputs) or not spec.output_shapes:
        lines.append("  (shapes in numbers: a 2-row case at the quick config; the op declares none in words)")
    if spec.constants:
        lines.append(f"  constants (keyword arguments, from the config: --set NAME=VALUE): {constants}")
    sizes = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
             if f.name not in spec.constants and isinstance(getattr(params, f.name), int)}
    if sizes:
        lines.append(f"  sizes at the default config: {', '.join(f'{k}={v}' for k, v in sizes.items())}")
    lines.append("  gradients come from autograd (--forward-only: a function without a backward)")
    return "\n".join(lines)


def list_(ctx: typer.Context,
          device: str = typer.Option("auto", "--device", help="Where availability is judged."),
          op: Optional[str] = typer.Option(None, "--op", help="One op (or a user op, PATH.py:ATTR): its call signature, then its rows with "
                                                              "their whole sources.", show_default="every op")):
    """Ops with their rows, each available, skipped or unavailable, with the reason; with --op, the op's call
    signature (shapes, dtypes, roles, formula) and each row's whole source."""
    from rich.table import Table

    from h3bench.harness.adapter import as_default_row
    from h3bench.harness.schema import is_skip
    from h3bench.harness.config import load_config
    from h3bench.harness.ops import OP_MODULES, get_op

    program = _program(ctx)
    dev = _device(device)
    ops = list(OP_MODULES)
    sources: list[str] = []
    if op is not None:
        ops = _ops(op)
        for name in ops:
            try:
                text = signature(name)
            except ValueError as exc:  # a user op's own code failed while its outputs' shapes were read
                fail(str(exc))
            print(text)
    table = Table(title=f"h3bench on {dev}")
    table.add_column("op", no_wrap=True)          # names are typed back: never broken, never cut
    table.add_column("adapter", no_wrap=True)
    table.add_column("grads", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("source or reason", overflow="fold")
    for name in ops:
        spec = get_op(name)
        params = load_config(name).inputs
        table.add_section()
        rows = named_adapters(program, name)
        for row, adapter in rows.items():
            # judged as `run` judges its default rows: a row a CPU runs only when named reads as skipped
            loaded = as_default_row(adapter, dev).try_load(dev, params)
            if isinstance(loaded, str):
                status = "[yellow]skipped[/]" if is_skip(loaded) else "[yellow]unavailable[/]"
                text = loaded
            else:
                status, text = "[green]available[/]", loaded.short_source
                sources.append(f"  {row}: {loaded.source}")
            table.add_row(name, row, ",".join(adapter.grads) or "forward only", status, escape(text))
        if not rows:
            table.add_row(name, "-", ",".join(spec.differentiable), "", "no rows registered")
    _table_console().print(table)
    if op is not None and sources:
        print("sources of the available rows:")
        print("\n".join(sources))


def env(device: str = typer.Option("auto", "--device", help="auto, cuda or cpu."),
        bandwidth: bool = typer.Option(True, "--bandwidth/--no-bandwidth", metavar="",
                                       help="Measure copy, read and write bandwidth.")):
    """Print the environment block an evidence file would record."""
    from h3bench.harness import environment
    from h3bench.harness.schema import to_dict

    dev = _device(device)
    block = environment.capture(dev, {"plain": {}}, measure_bandwidth=bandwidth)
    print(json.dumps(to_dict(block), indent=2))


def _described(evidence) -> str:
    """`norm_modulate, 6 rows, gpu NVIDIA H100 80GB HBM3`, or the device where the file has no GPU."""
    rows = sum(len(r) for r in evidence.measured_modes().values())
    env = evidence.environment
    where = f"gpu {env.gpu}" if env.gpu else f"device {env.device or 'not recorded'}"
    return f"{evidence.op}, {rows} row{'' if rows == 1 else 's'}, {where}"


def validate(files: List[Path] = typer.Argument(..., help="Evidence JSON file(s) (or norm_modulate sweep files)."),
             op: List[str] = typer.Option([], "--op", help="A user op the files are of: PATH.py:ATTR, "
                                                           "module:ATTR or an h3bench.ops entry point.",
                                          show_default=False)):
    """Check files against the contract (keys, nesting, types) and for meaning (figures, counts, verdicts,
    plan totals); every file is checked and each problem named; exit 1 if any file fails, 2 if a file is
    missing or a folder (bad input)."""
    from h3bench.harness import semantics
    from h3bench.harness.schema import FOLDER_NOT_FILE, SchemaError, from_json, read_json

    for text in op:
        _ops(text)

    bad, missing = 0, 0
    for file in files:
        if not file.exists() or file.is_dir():
            missing += 1
            what = "no such file" if not file.exists() else FOLDER_NOT_FILE
            err.print(f"[red]{escape(f'{file}: {what}')}[/]", highlight=False)
            continue
        try:
            data = read_json(file)
            if semantics.is_sweep(data):
                problems, what = semantics.sweep_problems(data), "norm_modulate sweep"
            else:
                evidence = from_json(data)
                problems, what = semantics.problems(evidence), _described(evidence)
        except (SchemaError, OSError) as exc:
            problems, what = [str(exc)], None
        if problems:
            bad += 1
            for problem in problems:
                err.print(f"[red]{escape(f'{file}: invalid: {problem}')}[/]", highlight=False)
        else:
            print(f"{file}: valid ({what})")
    raise typer.Exit(2 if missing else 1 if bad else 0)
