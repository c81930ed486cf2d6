"""Batch invariance as a test assertion, for any pytest suite:

    from h3bench.testing import assert_batch_invariant, check_batch_invariance
    assert_batch_invariant(fn, {"x": x, "w": w, "idx": idx}, per_row=["x", "idx"])

`fn` is called with the inputs as keyword arguments, in the given order. The per-row inputs share their
first dimension (the rows); the others are shared by every row. The examples declare an op
(harness/ops/from_examples.py: new rows drawn like the examples, seeded, on their device; inputs that
require grad get gradients), and the function runs through the harness's own batch-invariance probes
(harness/probes/batch_invariance.py) under the quick plan (configs/plans/quick.toml: all_rows, the
sub-batches of a 640-row batch and the sweep, across 256 and 512 rows), or the full one (`plan="full"`,
configs/plans/token.toml). `op="norm_modulate"` takes a built-in op's inputs (its quick config) and plan
set instead of examples. These are the RFC's probes, whose counts decide `.invariant`; the probes beyond
them (contention, graph replay, layout) stay `h3bench run`'s, where a row's evidence is measured.

Installed as `h3bench.testing` (pyproject.toml maps this folder there); import it by that name only.

Blame as in `h3bench run`: the caller's misuse (no examples, an unknown per-row name, per-row inputs of
different lengths, ...) is a one-line TypeError or ValueError; the function's own failure (it raises,
returns a non-tensor, or an output of the wrong shape, dtype or device) makes the record "unavailable:
<reason>" and the assertion fail with that line.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from h3bench.harness.user_code import accepted_constants
from h3bench.harness.config import load_config, load_plans
from h3bench.harness.execute import ImplementationError, describe_exception, implementation_code, settle
from h3bench.harness.localize import locate as locate_origins
from h3bench.harness.ops import get_op
from h3bench.harness.ops.base import Op
from h3bench.harness.ops.from_examples import (ExampleParams, ExamplesOp, check_examples, contract_dtypes,
                                               output_specs)
from h3bench.harness.probes import batch_invariance as bi
from h3bench.harness.probes.context import ProbeContext

from .record import CheckCount, InvarianceCheck, from_probes, unavailable

__all__ = ["assert_batch_invariant", "check_batch_invariance", "InvarianceCheck", "CheckCount"]

PLANS = ("quick", "full")
EXAMPLES_FULL_PLAN = "token"  # the plan set `plan="full"` gives an op from examples (the RFC's token ops')


def assert_batch_invariant(fn: Callable, examples: Optional[Mapping[str, torch.Tensor]] = None,
                           per_row: Sequence[str] | str = (), *, op: Optional[str] = None, plan: str = "quick",
                           grads: bool = True, device: Any = None, name: Optional[str] = None,
                           out_dtype: Any = None, locate: Optional[bool] = None) -> InvarianceCheck:
    """`check_batch_invariance`, raising AssertionError with its message (which names the first origin when
    located) unless the function is batch-invariant; returns the record otherwise."""
    record = check_batch_invariance(fn, examples, per_row, op=op, plan=plan, grads=grads, device=device, name=name,
                                    out_dtype=out_dtype, locate=locate)
    if not record.invariant:
        raise AssertionError(record.message())
    return record


def check_batch_invariance(fn: Callable, examples: Optional[Mapping[str, torch.Tensor]] = None,
                           per_row: Sequence[str] | str = (), *, op: Optional[str] = None, plan: str = "quick",
                           grads: bool = True, device: Any = None, name: Optional[str] = None,
                           out_dtype: Any = None, locate: Optional[bool] = None) -> InvarianceCheck:
    """Run `fn` through the batch-invariance probes and return the record (never raises for the function's
    own failures). `grads=False`: forward only. `device`: with `op`, where it runs (default: CUDA when there
    is one); examples run on their own device, which `device` may name. `name` names the function in
    messages (default: its qualified name). A floating-point output's dtype must be the first
    floating-point per-row input's (as for `h3bench run`'s user ops); `out_dtype` (a dtype, or one per
    output) declares another.

    `locate` (default: on when `fn` is an nn.Module): when a check fails, its case is run again recorded
    (harness/localize/) and the record's `origins` name where the rows part: the innermost module whose
    per-row inputs are equal in both runs and whose outputs are not, the dispatcher op inside it, the
    phase, shapes, rows and ULP distance; `localisations` hold the searches. Memory: per op and row one
    int64 digest of each tensor, plus the origin ops' outputs at the compared rows (at most 64 events);
    cost: the case's two sides run once recorded and the smaller side once more, per search (at most two
    searches: the batch case, and the batch against itself when parameter gradients do not repeat)."""
    started = time.perf_counter()
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if plan not in PLANS:
        raise ValueError(f"plan must be one of {', '.join(PLANS)}, got {plan!r}")
    if not isinstance(grads, bool):
        raise TypeError(f"grads must be True or False, got {grads!r}")
    label = name or getattr(fn, "__qualname__", None) or type(fn).__name__
    if op is not None:
        if examples is not None or per_row:
            raise ValueError("give examples (and per_row) or op=, not both")
        if out_dtype is not None:
            raise ValueError("out_dtype= declares the outputs of examples; a built-in op's contract is its own")
        return _check_builtin(fn, op, plan, grads, device, label, started, bool(locate))
    if examples is None:
        raise TypeError("give example inputs (a dict of name -> tensor, with per_row) or a built-in op's name (op=)")
    rows_names = (per_row,) if isinstance(per_row, str) else tuple(per_row or ())
    where = check_examples(examples, rows_names)
    if device is not None:
        asked = _as_device(device)
        if asked.type != where.type or asked.index not in (None, where.index):
            raise ValueError(f"device={device!r}, but the examples are on {where}: examples run on their own device")
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype) and not (
            isinstance(out_dtype, (tuple, list)) and out_dtype and all(isinstance(d, torch.dtype) for d in out_dtype)):
        raise TypeError(f"out_dtype must be a torch.dtype or a tuple of them (one per output), got {out_dtype!r}")
    located = isinstance(fn, torch.nn.Module) if locate is None else bool(locate)
    return _check_examples(fn, examples, rows_names, plan, grads, where, label, started, out_dtype, located)


def _as_device(device: Any) -> torch.device:
    """`device` as a torch.device this process can use, or a one-line ValueError."""
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a device ({describe_exception(exc)})") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but CUDA is not available here")
    return found


def _keywords(fn: Callable, names: Sequence[str], constants: Mapping[str, Any]) -> Callable:
    """`fn` taking the op's inputs in call order, as the probes call it, passing them as keywords."""
    def call(*tensors):
        return fn(**dict(zip(names, tensors)), **constants)
    return call


def _check_examples(fn, examples, per_row, plan, grads, device, label, started, out_dtype,
                    locate: bool = False) -> InvarianceCheck:
    call = _keywords(fn, list(examples), {})
    try:
        op = _declare(call, examples, per_row, grads, device, label, out_dtype)
    except ImplementationError as exc:
        return unavailable(label, plan, str(device), str(exc), time.perf_counter() - started)
    plans = load_plans("quick" if plan == "quick" else EXAMPLES_FULL_PLAN)
    return _probe(op, ExampleParams(), call, plans, plan, device, label, started, located=_located(fn, locate))


def _declare(call: Callable, examples, per_row, grads: bool, device: torch.device, label: str,
             out_dtype: Any = None) -> ExamplesOp:
    """The op the examples declare; its outputs from one call of the function on the examples (the
    function's failure or contract breach there: ImplementationError)."""
    with implementation_code(), torch.no_grad():
        result = call(*(t.detach() for t in examples.values()))
        settle(list(examples.values()))
    outputs = (result,) if isinstance(result, torch.Tensor) else result
    if (not isinstance(outputs, (tuple, list)) or not outputs
            or not all(isinstance(t, torch.Tensor) for t in outputs)):
        raise ImplementationError(f"fn returned {type(result).__name__}, expected a tensor or a tuple of tensors")
    dtypes = contract_dtypes(examples, per_row, len(outputs), out_dtype)  # the caller's misuse: TypeError
    try:
        specs = output_specs(outputs, examples[per_row[0]].shape[0], device, dtypes)
    except ValueError as exc:
        raise ImplementationError(str(exc)) from None
    return ExamplesOp(label, examples, per_row, specs, grads=grads)


def _check_builtin(fn, op_name, plan, grads, device, label, started, locate: bool = False) -> InvarianceCheck:
    op = get_op(op_name)
    where = _as_device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    config = load_config(op_name, quick=True)  # the op's inputs at its quick size, whichever plan
    plans = (dict(all_rows=config.all_rows, full_vs_sub=config.full_vs_sub, sweep=config.sweep)
             if plan == "quick" else load_plans(op.plan_set))
    constants = {c: getattr(config.inputs, c) for c in accepted_constants(fn, op.constants)}
    call = _keywords(fn, op.input_names, constants)
    op_grads = op.differentiable if grads else ()
    return _probe(op, config.inputs, call, plans, plan, where, label, started, op_grads,
                  located=_located(fn, locate))


def _located(fn: Callable, locate: bool) -> Any:
    """What `_probe` takes: False, or the module the modules are named from (True: the outermost called)."""
    if not locate:
        return False
    return fn if isinstance(fn, torch.nn.Module) else True


def _probe(op: Op, params: Any, call: Callable, plans: Mapping[str, Any], plan: str, device: torch.device,
           label: str, started: float, grads: Optional[tuple[str, ...]] = None,
           located: Any = False) -> InvarianceCheck:
    """The RFC's three probes, as `h3bench run` runs them for a row, with the record they give; `located`
    (True, or the nn.Module checked, which names the modules): a failing record's origins located."""
    ctx = ProbeContext(op=op, params=params, fn=call, grads=op.differentiable if grads is None else grads,
                       device=device, reference_variant=op.name)
    moved: list = []
    steps = (("all_rows", lambda: bi.all_rows(ctx, plans["all_rows"], moved)),
             ("full_vs_sub_batches", lambda: bi.full_vs_sub_batches(ctx, plans["full_vs_sub"])),
             ("batch_size_sweep", lambda: bi.batch_size_sweep(ctx, plans["sweep"])))
    found = {}
    for check, step in steps:
        try:
            found[check] = step()
        except ImplementationError as exc:  # the function's own failure is its verdict
            return unavailable(label, plan, str(device), f"{exc} (in {check})", time.perf_counter() - started)
    cases, repeatable = found["all_rows"]
    record = bi.verdict(cases, repeatable, found["full_vs_sub_batches"], found["batch_size_sweep"], moved)
    searches = ()
    if located is not False and not record.batch_invariant:
        root = located if isinstance(located, torch.nn.Module) else None
        searches = locate_origins(op, params, call, plans, ctx.grads, ctx.row_grads, device, record, root)
    return from_probes(label, plan, str(device), record, ctx.param_grads, time.perf_counter() - started, searches)
