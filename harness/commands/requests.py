"""`h3bench run`'s requests (harness/runner.py's RunRequest), one per op, from its checked flags: each op's
config for the run's plan, its rows, where its evidence goes, and the arguments that make a mode's child
process run the same. Nothing is written here: each output path is only checked to be writable."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from h3bench.harness.commands import ALL_OPS, BadInput, Program
from h3bench.harness.commands.outputs import check_writable, refuse_overwrite
from h3bench.harness.commands.plan import Plan
from h3bench.harness.commands.rows import select_adapters

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RunOptions:
    """`h3bench run`'s flags once checked (h3bench.cli): what its requests are built from and how they run."""

    ops: list[str]                    # op names, in the order given (user ops resolved)
    device: torch.device
    plan: Plan
    config: Optional[Path]
    sets: tuple[str, ...]             # --set, with --flush-l2 and --graph-timing as the plan keys they set
    adapters: Optional[str]           # --adapters as given: None for every built-in row
    externals: tuple[str, ...]        # --adapter
    forward_only: bool
    modes: list[str]
    out: Optional[Path]
    force: bool
    render: bool
    quiet: bool
    mode_timeout: Optional[float]
    gpus: Optional[str]
    per_gpu: int
    ray: Optional[str]
    require_invariant: Optional[str]
    in_process: bool
    control: str                      # harness/control.py: HERE, SKIP or ELSEWHERE
    control_only: bool
    command: str                      # the command line, recorded in the file

    @property
    def fans_out(self) -> bool:
        return self.gpus is not None or self.ray is not None


def resolve_ops(text: str) -> list[str]:
    """`--op NAME[,NAME]` or `--op all`, in the order given (all: the RFC's suite, `all_ops`); a NAME may be a
    user's op (harness/op_source.py: PATH.py:ATTR, module:ATTR, an h3bench.ops entry point)."""
    from h3bench.harness import op_source
    from h3bench.harness.ops import OP_MODULES, all_ops

    names = [n.strip() for n in text.split(",") if n.strip()]
    if ALL_OPS in names:
        return all_ops()
    if not names:
        raise BadInput(f"unknown op {text!r}; known ops: {', '.join(OP_MODULES)}, or {ALL_OPS}; {op_source.FORMS}")
    try:
        return list(dict.fromkeys(op_source.resolve(n).name for n in names))
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def build_requests(options: RunOptions, program: Program) -> list:
    """One RunRequest per op, its output path checked writable (and not an existing file it would overwrite
    without --force)."""
    from h3bench.harness import op_source
    from h3bench.harness.adapter import as_default_row
    from h3bench.harness.config import ConfigError, load_config
    from h3bench.harness.runner import RunRequest

    requests = []
    for name in options.ops:
        try:
            cfg = load_config(name, options.config, options.plan.quick, options.sets)
            op_source.check(name, cfg.inputs, options.device)  # a user op's own mistakes, named before anything runs
        except ValueError as exc:  # ConfigError, or a user op that fails on a small case
            raise BadInput(f"{name}: {exc}" if len(options.ops) > 1 else str(exc)) from None
        chosen = select_adapters(program, name, options.adapters, options.externals, options.forward_only)
        if options.adapters is None:  # the default rows: on a CPU, those too costly for it run only when named
            chosen = [as_default_row(a, options.device) for a in chosen]
        requests.append(RunRequest(
            config=cfg, device=options.device, adapters=chosen, modes=options.modes, out=None,
            command=options.command, mode_timeout_s=options.mode_timeout, in_process=options.in_process,
            control=options.control, control_only=options.control_only,
            control_adapter=program.control_adapter(name), child_program=program.child_program,
            child_args=child_args(name, options, cfg.quick)))
    for request, out in zip(requests, out_paths(options, requests[0].config.quick)):
        request.out = out
        check_writable(out)
        if options.out is not None:
            refuse_overwrite([out], options.force, "--out")
    return requests


def out_paths(options: RunOptions, quick: bool) -> list[Path]:
    """Each op's evidence path: --out, or a timestamped path under runs/ (several ops: a folder of files)."""
    from h3bench.harness.runner import default_out_path

    out = options.out
    if len(options.ops) == 1:
        return [out or default_out_path(options.ops[0], options.device, quick)]
    if out is not None and (out.suffix.lower() == ".json" or out.is_file()):
        raise BadInput(f"--out {out}: with several ops --out names a folder (one evidence file per op goes in it)")
    folder = out or default_out_path(ALL_OPS, options.device, quick).with_suffix("")
    return [folder / f"{name}.json" for name in options.ops]


def child_args(op: str, options: RunOptions, quick: bool) -> tuple[str, ...]:
    """The arguments that make a mode's child process run the same op, plan and rows."""
    from h3bench.harness.op_source import spec_of

    args = ["--op", spec_of(op), "--device", options.device.type, "--quick" if quick else "--full"]
    if options.forward_only:
        args.append("--forward-only")
    if options.adapters is not None:
        args += ["--adapters", options.adapters]
    if options.config is not None:
        args += ["--config", str(options.config)]
    for item in options.sets:
        args += ["--set", item]
    for text in options.externals:
        args += ["--adapter", text]
    return tuple(args)


def required_rows(text: Optional[str], requests: Sequence) -> Optional[object]:
    """--require-invariant's selection (harness/gate.py), checked against the rows the run will have before
    anything runs."""
    from h3bench.harness import gate

    if text is None:
        return None
    try:
        selection = gate.parse_selection(text)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    rows = {a.name for r in requests for a in r.adapters}
    unknown = gate.unknown_rows(selection, rows)
    if unknown:
        raise BadInput(f"--require-invariant names row(s) this run does not have: {', '.join(unknown)}; "
                       f"rows: {', '.join(sorted(rows))}")
    return selection
