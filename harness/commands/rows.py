"""The rows an op's run or listing has: the program's built-in rows, rows that installed packages register
(the `h3bench.adapters` entry-point group), and `--adapter` functions, each under a name no other row has."""
from __future__ import annotations

import dataclasses
from importlib import metadata
from typing import Optional, Sequence

from rich.markup import escape

from h3bench.harness.commands import BadInput, Program
from h3bench.harness.console import make_console

ENTRY_POINT_GROUP = "h3bench.adapters"

_WARNED: set = set()


def _warn_once(key: tuple, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        make_console(stderr=True).print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


def entry_point_adapters(op: str) -> dict:
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
            elif not row:  # no op in its name: it cannot be given a row
                _warn_once((ep.name, op), f"{reason} (skipped)")
    return found


def named_adapters(program: Program, op: str) -> dict:
    """Every row `op` has by name: the built-in ones, then those of installed packages."""
    named = {a.name: a for a in program.builtin_adapters(op)}
    for name, adapter in entry_point_adapters(op).items():
        if name in named:  # the name keeps meaning the built-in row, and says so: no silent stand-in
            _warn_once((name, op, "clash"), f"an installed package registers a row {name} for {op}, a built-in "
                                            f"row name; the built-in row keeps it (skipped)")
            continue
        named[name] = adapter
    return named


def select_adapters(program: Program, op: str, selection: Optional[str], externals: Sequence[str],
                    forward_only: bool = False) -> list:
    """The rows `--adapters` (None: every one; "none": no built-in row) and `--adapter` give the run."""
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
            raise BadInput(f"unknown adapter(s) {', '.join(unknown)} for op {op}; known: {', '.join(named)}")
        chosen = [named[w] for w in wanted]
    spec = get_op(op)
    for text in externals:
        try:
            adapter = load_external(text, op=op, differentiable=spec.differentiable, n_inputs=len(spec.inputs),
                                    constants=spec.constants, forward_only=forward_only)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        taken = next((a for a in chosen if a.name == adapter.name), None)
        if taken is not None:  # a renamed row would leave the name, and the gate, to the other one
            builtin = named.get(taken.name) is taken
            target = text.partition("=")[2] if "=" in text else text
            raise BadInput(f"--adapter {text}: the row name {adapter.name} is taken by "
                           + (f"the built-in row; name yours (--adapter NAME={target}) or leave the built-in out "
                              f"(--adapters without {adapter.name})" if builtin else
                              "another --adapter; give each its own name (--adapter NAME=module:attr)"))
        chosen.append(adapter)
    if not chosen:
        raise BadInput("no adapters selected: name some with --adapters or --adapter module:attr")
    return chosen
