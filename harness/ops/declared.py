"""The Op the harness makes of a user's declaration (harness/ops/public.py: UserOp).

The harness reads an op only through `Op` (harness/ops/base.py), so a declaration becomes one: its
constants become a frozen params record (the config's `[inputs]` table, with the declared defaults), its
reference is run in float64 through the shared plumbing, the outputs' contract follows from the reference,
and the negative control gets a composition to plant its fault in.

Blame: what the user's own code does wrong (make_inputs or the reference raising, returning the wrong
tensors) is a `UserOpError` that names the op, its source and the function: `h3bench run` prints that one
line and exits 2, as for any bad input. An implementation under test is blamed separately (its row).
"""
from __future__ import annotations

import dataclasses
import functools
import keyword
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

from h3bench.harness.ops.base import Input, Op, OpInputs, Reference, Traffic, generator
from h3bench.harness.ops.public import UserOp
from h3bench.harness.user_code import accepted_constants

CONSTANT_TYPES = (bool, int, float, str)
SHAPE_ROWS = 2  # rows of the case the outputs' shapes are read from (two: a row dimension of 1 could be squeezed)


class UserOpError(ValueError):
    """A user op's declaration is inconsistent, or its own code (make_inputs, reference, ...) failed."""


def _identifier(name: Any) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def declaration_problems(decl: UserOp) -> list[str]:
    """What is inconsistent in `decl`, one phrase each; empty when it can be run."""
    found = []
    if not (isinstance(decl.name, str) and decl.name and all(c.isalnum() or c in "_-" for c in decl.name)):
        found.append(f"name {decl.name!r} must be a non-empty word (letters, digits, _ and -: it names files)")
    inputs = decl.inputs
    if not isinstance(inputs, (tuple, list)) or not inputs or not all(isinstance(i, Input) for i in inputs):
        found.append(f"inputs must be a non-empty tuple of Input(name, per_row=..., differentiable=...), "
                     f"got {inputs!r}")
        inputs = ()
    names = [i.name for i in inputs]
    bad = [n for n in names if not _identifier(n)]
    if bad:
        found.append(f"input name(s) {bad} must be Python identifiers (they are keyword arguments)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        found.append(f"input name(s) {twice} declared twice")
    if inputs and not any(i.per_row for i in inputs):
        found.append("no input is per_row: batch invariance needs a row dimension (declare the rows' input "
                     "per_row=True)")
    outputs = decl.outputs
    if isinstance(outputs, str) or not isinstance(outputs, (tuple, list)) or not outputs \
            or not all(isinstance(o, str) and o for o in outputs):
        found.append(f"outputs must be a non-empty tuple of names, got {outputs!r}")
    elif len(set(outputs)) != len(outputs):
        found.append(f"outputs {list(outputs)} name one output twice")
    if not isinstance(decl.constants, Mapping):
        found.append(f"constants must be a dict of name -> default, got {type(decl.constants).__name__}")
    else:
        for key, value in decl.constants.items():
            if not _identifier(key):
                found.append(f"constant {key!r} must be a Python identifier")
            elif key in names:
                found.append(f"constant {key!r} has an input's name")
            if not isinstance(value, CONSTANT_TYPES):
                found.append(f"constant {key!r} has default {value!r} ({type(value).__name__}): a default is an "
                             f"int, float, str or bool (a TOML value, so --set can change it)")
    for what in ("make_inputs", "reference"):
        if not callable(getattr(decl, what)):
            found.append(f"{what} must be a function, got {type(getattr(decl, what)).__name__}")
    for what in ("composition", "make_grad_outs", "floor_traffic"):
        value = getattr(decl, what)
        if value is not None and not callable(value):
            found.append(f"{what} must be a function or None, got {type(value).__name__}")
    for what in ("plans", "quick_plans"):
        if not isinstance(getattr(decl, what), (str, Path, Mapping)):
            found.append(f"{what} must be a plan set's name, a TOML path or a dict of plan tables, got "
                         f"{type(getattr(decl, what)).__name__}")
    return found


def _describe(exc: BaseException) -> str:
    """"Type: first line", as harness/execute.py's describe_exception words a row's failure (ops/ imports
    nothing above it)."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class DeclaredOp(Op):
    """An Op from a UserOp; `source` says where it was declared (`/abs/my_op.py:MY_OP`), `base_dir`
    where its relative plan paths are found."""

    def __init__(self, decl: UserOp, source: str, base_dir: Optional[Path] = None):
        problems = declaration_problems(decl)
        if problems:
            raise UserOpError(f"op declaration {source} is inconsistent: " + "; ".join(problems))
        self.declaration = decl
        self.source = source
        self.base_dir = base_dir
        self.name = decl.name
        self.rfc = f"none: a user op ({source})"
        self.inputs = tuple(decl.inputs)
        self.outputs = tuple(decl.outputs)
        self.constants = tuple(decl.constants)
        self.plan_set = decl.plans if isinstance(decl.plans, str) else ""
        self.declares_traffic = decl.floor_traffic is not None
        self.params_type = dataclasses.make_dataclass(
            f"{decl.name.replace('-', '_')}_constants",
            [(key, type(value), dataclasses.field(default=value)) for key, value in decl.constants.items()],
            frozen=True)
        self._shapes: dict[tuple, tuple[tuple[tuple[int, ...], ...], torch.dtype]] = {}

    # --- blame --------------------------------------------------------------------------------------------
    def _fail(self, what: str, detail: str) -> UserOpError:
        return UserOpError(f"op {self.name} ({self.source}): {what} {detail}")

    def _call(self, what: str, fn: Callable, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserOpError:
            raise
        except Exception as exc:  # the op's own code failed: its one line, not a harness traceback
            raise self._fail(what, f"raised {_describe(exc)}") from exc

    def _constants_for(self, fn: Callable, params: Any) -> dict[str, Any]:
        return {c: getattr(params, c) for c in accepted_constants(fn, self.constants)}

    def as_outputs(self, result: Any, rows: int, what: str) -> tuple[torch.Tensor, ...]:
        found = (result,) if isinstance(result, torch.Tensor) else result
        if not isinstance(found, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in found):
            raise self._fail(what, f"returned {type(result).__name__}, expected "
                                   f"{'a tensor' if len(self.outputs) == 1 else f'{len(self.outputs)} tensors'}")
        if len(found) != len(self.outputs):
            raise self._fail(what, f"returned {len(found)} tensors, the op declares {len(self.outputs)} outputs "
                                   f"({', '.join(self.outputs)})")
        for name, t in zip(self.outputs, found):
            if t.dim() == 0 or t.shape[0] != rows:
                raise self._fail(what, f"returned output {name!r} of shape {tuple(t.shape)} for {rows} rows: every "
                                       f"output's first dimension is the rows")
        return tuple(found)

    # --- what an Op implements ------------------------------------------------------------------------------
    def make_inputs(self, params: Any, rows: int, seed: int, device: torch.device) -> OpInputs:
        made = self._call("make_inputs", self.declaration.make_inputs, params, rows, seed, device)
        if not isinstance(made, Mapping):
            raise self._fail("make_inputs", f"returned {type(made).__name__}, expected a dict of the inputs by name")
        if set(made) != set(self.input_names):
            raise self._fail("make_inputs", f"returned inputs {sorted(made)}, the op declares "
                                            f"{list(self.input_names)}")
        for i in self.inputs:
            t = made[i.name]
            if not isinstance(t, torch.Tensor):
                raise self._fail("make_inputs", f"returned {type(t).__name__} for input {i.name!r}, expected a tensor")
            if t.device.type != device.type:
                raise self._fail("make_inputs", f"returned input {i.name!r} on {t.device}, asked for {device}")
            if i.per_row and (t.dim() == 0 or t.shape[0] != rows):
                raise self._fail("make_inputs", f"returned per-row input {i.name!r} of shape {tuple(t.shape)} "
                                                f"for {rows} rows")
            if i.differentiable and not t.is_floating_point():
                raise self._fail("make_inputs", f"returned differentiable input {i.name!r} as {t.dtype}: a "
                                                f"gradient needs a floating-point tensor")
        return self.bundle(dict(made))

    def _contract(self, params: Any, device: torch.device) -> tuple[tuple[tuple[int, ...], ...], torch.dtype]:
        """The outputs' shapes past the row dimension (from the float64 reference of a small case on
        `device`) and their dtype: the first floating-point per-row input's (else the first floating-point
        input's)."""
        key = (params, device.type)
        if key not in self._shapes:
            inputs = self.make_inputs(params, SHAPE_ROWS, 0, device)
            outputs = self.reference(params, inputs, None, (), self.name).outputs
            floating = [t.dtype for name, t in inputs.tensors.items() if t.is_floating_point()
                        and name in inputs.row_names] or [t.dtype for t in inputs.tensors.values()
                                                          if t.is_floating_point()] or [torch.float32]
            self._shapes[key] = tuple(tuple(o.shape[1:]) for o in outputs), floating[0]
        return self._shapes[key]

    def make_grad_outs(self, params: Any, rows: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        if self.declaration.make_grad_outs is not None:
            found = self._call("make_grad_outs", self.declaration.make_grad_outs, params, rows, seed, device)
            return self.as_outputs(found, rows, "make_grad_outs")
        shapes, dtype = self._contract(params, device)
        gen = generator(device, seed)
        return tuple(torch.randn(rows, *shape, generator=gen, device=device).to(dtype) for shape in shapes)

    def reference(self, params: Any, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        fn = self.declaration.reference
        constants = self._constants_for(fn, params)

        def math(leaves: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
            found = self._call("reference", fn, *(leaves[n] for n in self.input_names), **constants)
            return self.as_outputs(found, inputs.rows, "reference")

        return self._call("reference", self.float64_reference, inputs, grad_outs, grads, variant, math)

    def floor_traffic(self, params: Any, rows: int, backward: bool) -> Traffic:
        if self.declaration.floor_traffic is None:
            raise NotImplementedError(f"op {self.name} declares no floor_traffic")
        found = self._call("floor_traffic", self.declaration.floor_traffic, params, rows, backward)
        if not isinstance(found, Traffic):
            raise self._fail("floor_traffic", f"returned {type(found).__name__}, expected Traffic(read=, written=)")
        return found

    # --- the negative control's composition ---------------------------------------------------------------
    @property
    def control_subject(self) -> str:
        return ("the op's composition" if self.declaration.composition is not None else
                "the op's reference in the inputs' dtype")

    def control_composition(self) -> tuple[Callable, str]:
        """The honest implementation the control plants its fault into, and what it is: the declared
        composition, else the reference evaluated in the inputs' own dtype (not float64, so that it rounds
        like an implementation), each floating-point output cast to the dtype of the first floating-point
        per-row argument (the default contract)."""
        if self.declaration.composition is not None:
            return self.declaration.composition, f"{self.control_subject} ({self.source})"
        reference = self.declaration.reference
        row_positions = [k for k, i in enumerate(self.inputs) if i.per_row]

        @functools.wraps(reference)  # keeps the reference's signature: the constants it names still reach it
        def in_inputs_dtype(*args, **constants):
            outputs = self.as_outputs(reference(*args, **constants), args[row_positions[0]].shape[0], "reference")
            dtype = next((args[k].dtype for k in row_positions if args[k].is_floating_point()), None)
            return tuple(o.to(dtype) if dtype is not None and o.is_floating_point() else o for o in outputs)

        return in_inputs_dtype, f"{self.control_subject} ({self.source})"

    def check(self, params: Any, device: torch.device) -> None:
        """Run the declaration once on a small case on `device` (inputs, upstream gradients, the float64
        reference with every gradient), so that its own mistakes are named before anything is measured."""
        inputs = self.make_inputs(params, SHAPE_ROWS + 1, 0, device)
        grad_outs = self.make_grad_outs(params, SHAPE_ROWS + 1, 0, device)
        found = self.reference(params, inputs, grad_outs, self.differentiable, self.name)
        for name, got, want in zip(self.outputs, found.outputs, grad_outs):
            if tuple(got.shape) != tuple(want.shape):
                raise self._fail("make_grad_outs", f"gives output {name!r} shape {tuple(want.shape)}, the reference "
                                                   f"returns {tuple(got.shape)}")
        if self.declaration.floor_traffic is not None:
            self.floor_traffic(params, SHAPE_ROWS + 1, bool(self.differentiable))
