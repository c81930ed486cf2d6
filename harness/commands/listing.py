"""`h3bench list`: every op's rows, each available, skipped or unavailable on the device with the reason,
and with `--op` the op's call signature (what an --adapter function must accept and return) and each
available row's whole source."""
from __future__ import annotations

from typing import Optional

from rich.markup import escape

from h3bench.harness.commands import BadInput, Program
from h3bench.harness.commands.requests import resolve_ops
from h3bench.harness.commands.rows import named_adapters
from h3bench.harness.console import table_console


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


def list_rows(program: Program, device, op: Optional[str]) -> None:
    """Print the rows table (and with `op` its signatures first, its rows' sources after)."""
    from rich.table import Table

    from h3bench.harness.adapter import as_default_row
    from h3bench.harness.config import load_config
    from h3bench.harness.ops import OP_MODULES, get_op
    from h3bench.harness.schema import is_skip

    ops = list(OP_MODULES)
    sources: list[str] = []
    if op is not None:
        ops = resolve_ops(op)
        for name in ops:
            try:
                text = signature(name)
            except ValueError as exc:  # a user op's own code failed while its outputs' shapes were read
                raise BadInput(str(exc)) from None
            print(text)
    table = Table(title=f"h3bench on {device}")
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
            loaded = as_default_row(adapter, device).try_load(device, params)
            if isinstance(loaded, str):
                status = "[yellow]skipped[/]" if is_skip(loaded) else "[yellow]unavailable[/]"
                text = loaded
            else:
                status, text = "[green]available[/]", loaded.short_source
                sources.append(f"  {row}: {loaded.source}")
            table.add_row(name, row, ",".join(adapter.grads) or "forward only", status, escape(text))
        if not rows:
            table.add_row(name, "-", ",".join(spec.differentiable), "", "no rows registered")
    table_console().print(table)
    if op is not None and sources:
        print("sources of the available rows:")
        print("\n".join(sources))
