"""The h3bench command line: parse, build the request, call the runner, print the summary."""
from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Batch-invariance, accuracy and latency evidence for GPU kernels.")
err = Console(stderr=True)
ENTRY_POINT_GROUP = "h3bench.adapters"


def fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _device(name: str):
    """Resolve the device; on a CPU, run Triton rows under the interpreter (must precede its import)."""
    from harness.runner import resolve_device

    try:
        device = resolve_device(name)
    except ValueError as exc:
        fail(str(exc))
    if device.type == "cpu" and "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    return device


def _named_adapters(op: str) -> dict:
    from adapters import builtin_adapters
    from harness.adapter import load_external
    from harness.ops import get_op

    named = {a.name: a for a in builtin_adapters() if a.op == op}
    differentiable = get_op(op).differentiable
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        adapter = load_external(ep.value, op=op, differentiable=differentiable)
        if adapter.op == op:
            named.setdefault(ep.name, adapter)
    return named


def _select_adapters(op: str, selection: Optional[str], externals: List[str]) -> list:
    from harness.adapter import load_external, replace
    from harness.ops import get_op

    named = _named_adapters(op)
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
    differentiable = get_op(op).differentiable
    for spec in externals:
        try:
            adapter = load_external(spec, op=op, differentiable=differentiable)
        except ValueError as exc:
            fail(str(exc))
        if adapter.name in {a.name for a in chosen}:
            adapter = replace(adapter, name=f"{adapter.name}_external")
        chosen.append(adapter)
    if not chosen:
        fail("no adapters selected: name some with --adapters or --adapter module:attr")
    return chosen


def _check_writable(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".h3bench-probe-"):
            pass
    except OSError as exc:
        fail(f"--out {path}: cannot write there ({exc.strerror or exc})")
    if path.exists() and path.is_dir():
        fail(f"--out {path}: is a directory")


@app.command()
def run(
    op: str = typer.Option("norm_modulate", "--op", help="Operator to run."),
    config: Optional[Path] = typer.Option(None, "--config", help="TOML config (default: the op's built-in)."),
    set_: List[str] = typer.Option([], "--set", help="Override a config key: KEY=VALUE or TABLE.KEY=VALUE."),
    quick: Optional[bool] = typer.Option(None, "--quick/--full",
                                         help="Quick or full plan. Default: full on CUDA, quick on CPU."),
    device: str = typer.Option("auto", "--device", help="auto, cuda or cpu."),
    adapters: Optional[str] = typer.Option(None, "--adapters", help="Built-in rows to run (a,b), or none."),
    adapter: List[str] = typer.Option([], "--adapter", help="Extra implementation module:attr (repeatable)."),
    mode: List[str] = typer.Option(["plain"], "--mode", help="Global mode(s): plain, deterministic."),
    out: Optional[Path] = typer.Option(None, "--out", help="Evidence JSON path (default runs/...)."),
    render: bool = typer.Option(True, "--render/--no-render", help="Write tables and plots beside the JSON."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars (CI logs)."),
):
    """Run every selected implementation through the probes and write the evidence JSON."""
    from harness.config import ConfigError, load_config
    from harness.modes import MODES
    from harness.runner import RunRequest, default_out_path
    from harness.runner import run as run_evidence

    dev = _device(device)
    plan_quick = quick if quick is not None else (config is None and dev.type == "cpu")
    try:
        cfg = load_config(op, config, plan_quick, tuple(set_))
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    unknown_modes = [m for m in mode if m not in MODES]
    if unknown_modes:
        fail(f"unknown mode(s) {', '.join(unknown_modes)}; known: {', '.join(MODES)}")
    chosen = _select_adapters(op, adapters, adapter)
    out_path = out or default_out_path(op, dev, cfg.quick)
    _check_writable(out_path)
    console = Console(stderr=True, quiet=quiet)
    console.print(f"h3bench: op {op}, device {dev}, plan {'quick' if cfg.quick else 'full'}"
                  f"{' (CPU default; --full for the full plan)' if quick is None and cfg.quick else ''}, "
                  f"hidden {getattr(cfg.inputs, 'hidden', '?')}, rows {', '.join(a.name for a in chosen)}"
                  f"{'; Triton under the interpreter' if os.environ.get('TRITON_INTERPRET') == '1' else ''}")
    request = RunRequest(config=cfg, device=dev, adapters=chosen, modes=list(dict.fromkeys(mode)),
                         out=out_path, command=shlex.join(["h3bench", *sys.argv[1:]]))
    started = time.perf_counter()
    if quiet:
        evidence = run_evidence(request)
    else:
        from harness.progress import RichObserver
        with RichObserver(console) as observer:
            evidence = run_evidence(request, observer)
    written = [out_path]
    if render:
        written += _render(out_path, console)
    from harness.progress import summary_table
    Console(quiet=quiet).print(summary_table(evidence))
    console.print(f"wrote {', '.join(str(p) for p in written)} in {time.perf_counter() - started:.1f}s")


def _render(path: Path, console: Console) -> list[Path]:
    try:
        from reports.render import render_all
    except ImportError as exc:
        console.print(f"[yellow]reports not rendered: {exc}[/]")
        return []
    return list(render_all(path))


@app.command("list")
def list_(device: str = typer.Option("auto", "--device", help="Where availability is judged.")):
    """Ops and adapters, each available or not, with the reason."""
    from rich.table import Table

    from harness.ops import OP_MODULES

    dev = _device(device)
    table = Table(title=f"h3bench on {dev}")
    for column in ("op", "adapter", "grads", "status", "source or reason"):
        table.add_column(column)
    for op in OP_MODULES:
        for name, adapter in _named_adapters(op).items():
            loaded = adapter.try_load(dev)
            ok = not isinstance(loaded, str)
            table.add_row(op, name, ",".join(adapter.grads) or "forward only",
                          "[green]available[/]" if ok else "[yellow]unavailable[/]",
                          loaded.source if ok else loaded)
    Console().print(table)


@app.command()
def env(device: str = typer.Option("auto", "--device"),
        bandwidth: bool = typer.Option(True, "--bandwidth/--no-bandwidth", help="Measure copy bandwidth.")):
    """Print the environment block an evidence file would record."""
    from harness import environment
    from harness.schema import to_dict

    dev = _device(device)
    block = environment.capture(dev, {"plain": {}}, measure_bandwidth=bandwidth)
    print(json.dumps(to_dict(block), indent=2))


@app.command()
def validate(files: List[Path] = typer.Argument(..., help="Evidence JSON file(s).")):
    """Check evidence files against the contract (keys, nesting, types)."""
    from harness.schema import SchemaError, load

    bad = 0
    for file in files:
        try:
            evidence = load(file)
        except FileNotFoundError:
            err.print(f"[red]{file}: no such file[/]")
            bad += 1
            continue
        except SchemaError as exc:
            err.print(f"[red]{file}: invalid: {exc}[/]")
            bad += 1
            continue
        rows = sum(len(r) for r in evidence.results.values())
        print(f"{file}: valid ({evidence.op}, {rows} rows, gpu {evidence.environment.gpu})")
    raise typer.Exit(1 if bad else 0)


@app.command()
def report(file: Path = typer.Argument(..., help="Evidence JSON."),
           out: Optional[Path] = typer.Option(None, "--out", help="Folder for the rendered files."),
           quiet: bool = typer.Option(False, "--quiet")):
    """Render Markdown, HTML and plots from an evidence file."""
    from reports.commands import report as render_report

    try:
        paths = render_report(file, out, quiet)
    except Exception as exc:
        fail(f"{file}: {exc}", 1)
    if not quiet:
        print("\n".join(str(p) for p in paths))


@app.command()
def compare(old: Path = typer.Argument(...), new: Path = typer.Argument(...)):
    """What changed between two evidence files; non-zero exit on a regression."""
    from reports.commands import compare_files

    try:
        code = compare_files(old, new)
    except Exception as exc:
        fail(str(exc), 2)
    raise typer.Exit(code)


@app.command()
def merge(files: List[Path] = typer.Argument(..., help="Evidence files of the same op."),
          out: Path = typer.Option(..., "-o", "--out", help="Merged evidence JSON.")):
    """Combine rows measured in separate runs; refuses differing GPU, torch or mode."""
    from reports.commands import merge_files

    try:
        path = merge_files(files, out)
    except Exception as exc:
        fail(str(exc), 2)
    print(path)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
