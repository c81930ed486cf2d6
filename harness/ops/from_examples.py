"""An `Op` declared by example tensors instead of an op module: for a function that is not one of the
built-in operators (h3bench.testing's `assert_batch_invariant(fn, {"x": x, "w": w}, per_row=["x"])`).

The examples say everything the probes need. Per-row inputs share their first dimension (the rows); every
other input is shared by all rows and passed as given. An input that requires grad is differentiable: a
per-row one gets its gradient compared row by row, a shared one (a parameter) is checked for bitwise
repeatability. The op's cases are new rows drawn like the examples' rows, seeded, on the examples' device:
floating inputs from a normal distribution with the example's mean and standard deviation, clamped to the
example's [min, max] (so a function defined on a range, a log or a square root, stays on it); integer and
bool inputs uniformly from the example's [min, max] (an index stays a valid index). Outputs are declared
from one call on the examples (`OutputSpec`): each is per-row, with the trailing shape that call gave; a
floating-point output's dtype is the contract's, as for a declared op (the first floating-point per-row
input's, or `out_dtype=`), never the call's own; upstream gradients are drawn for them as the built-in ops
draw theirs.

An op from examples has no float64 reference and no memory floor: it serves the batch-invariance probes,
which need neither.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from h3bench.harness.ops.base import Input, Op, OpInputs, Reference, Traffic, generator

# Upstream gradients are drawn from the case seed plus this, so they do not repeat the inputs' draws.
GRAD_SEED_OFFSET = 1 << 20


@dataclass(frozen=True)
class ExampleParams:
    """An op from examples has no constants: the function under test binds its own."""


@dataclass(frozen=True)
class OutputSpec:
    """One per-row output: its name, its shape after the row dimension, its dtype."""

    name: str
    trailing: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class _Draw:
    """How one per-row input's rows are drawn: its shape after the row dimension, its dtype, and the
    example's statistics (floats: mean, standard deviation, min, max; integers and bool: min, max)."""

    trailing: tuple[int, ...]
    dtype: torch.dtype
    low: float
    high: float
    mean: float = 0.0
    std: float = 0.0

    def rows(self, rows: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
        shape = (rows, *self.trailing)
        if self.dtype.is_floating_point:
            work = torch.float64 if self.dtype == torch.float64 else torch.float32
            drawn = torch.randn(shape, generator=gen, device=device, dtype=work) * self.std + self.mean
            return drawn.clamp(self.low, self.high).to(self.dtype)
        return torch.randint(int(self.low), int(self.high) + 1, shape, generator=gen, device=device,
                             dtype=torch.int64).to(self.dtype)


def _draw_like(name: str, example: torch.Tensor) -> _Draw:
    trailing = tuple(example.shape[1:])
    if example.dtype.is_floating_point:
        finite = example.detach()[torch.isfinite(example.detach())].double()
        if not finite.numel():
            raise ValueError(f"per-row input {name!r} has no finite value to draw rows like")
        std = float(finite.std(unbiased=False)) if finite.numel() > 1 else 0.0
        return _Draw(trailing, example.dtype, float(finite.min()), float(finite.max()), float(finite.mean()), std)
    if example.dtype.is_complex:
        raise TypeError(f"input {name!r} is {example.dtype}: examples must be floating, integer or bool tensors")
    if not example.numel():
        raise ValueError(f"per-row input {name!r} has no value to draw rows like")
    return _Draw(trailing, example.dtype, float(int(example.min())), float(int(example.max())))


def check_examples(examples: Mapping[str, torch.Tensor], per_row: Sequence[str]) -> torch.device:
    """The examples' device, or a one-line TypeError/ValueError saying what is wrong with them."""
    if not isinstance(examples, Mapping) or not examples:
        raise TypeError(f"examples must be a non-empty dict of name -> tensor, got {type(examples).__name__}")
    for name, t in examples.items():
        if not isinstance(name, str):
            raise TypeError(f"example names must be strings (fn's keyword arguments), got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"example {name!r} is a {type(t).__name__}, not a tensor "
                            f"(bind constants into fn, e.g. with functools.partial)")
    if not per_row:
        raise ValueError("per_row must name at least one input: the inputs whose first dimension is the rows")
    unknown = [n for n in per_row if n not in examples]
    if unknown:
        raise ValueError(f"per_row names {unknown} that are not among the examples {list(examples)}")
    if len(set(per_row)) != len(per_row):
        raise ValueError(f"per_row names an input twice: {list(per_row)}")
    for name in per_row:
        if examples[name].dim() == 0:
            raise ValueError(f"per-row input {name!r} is a scalar: a per-row input's first dimension is the rows")
    firsts = {name: examples[name].shape[0] for name in per_row}
    if len(set(firsts.values())) > 1:
        raise ValueError(f"per-row inputs must share their first dimension (the rows), got {firsts}")
    devices = {t.device for t in examples.values()}
    if len(devices) > 1:
        raise ValueError(f"examples must be on one device, got {sorted(str(d) for d in devices)}")
    return next(iter(devices))


class ExamplesOp(Op):
    """An op declared by example tensors (module docstring). `outputs` come from one call of the function
    on the examples; `grads`: whether inputs that require grad are differentiable (False: forward only)."""

    plan_set = "quick"
    params_type = ExampleParams

    def __init__(self, name: str, examples: Mapping[str, torch.Tensor], per_row: Sequence[str],
                 outputs: Sequence[OutputSpec], grads: bool = True):
        check_examples(examples, per_row)
        self.name = name
        self.inputs = tuple(Input(n, per_row=n in per_row, differentiable=grads and t.requires_grad)
                            for n, t in examples.items())
        self.outputs = tuple(o.name for o in outputs)
        self.output_specs = tuple(outputs)
        self._shared = {n: t.detach() for n, t in examples.items() if n not in per_row}
        self._draws = {n: _draw_like(n, examples[n]) for n in examples if n in per_row}

    def make_inputs(self, params: ExampleParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        gen = generator(device, seed)
        drawn = {n: self._draws[n].rows(rows, gen, device) if n in self._draws else self._shared[n]
                 for n in self.input_names}
        return self.bundle(drawn)

    def make_grad_outs(self, params: ExampleParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        gen = generator(device, seed + GRAD_SEED_OFFSET)
        return tuple(torch.randn((rows, *o.trailing), generator=gen, device=device).to(o.dtype)
                     if o.dtype.is_floating_point else torch.zeros((rows, *o.trailing), dtype=o.dtype, device=device)
                     for o in self.output_specs)

    def reference(self, params, inputs, grad_outs, grads, variant) -> Reference:
        raise NotImplementedError(f"{self.name}: an op declared by examples has no float64 reference")

    def floor_traffic(self, params, rows: int, backward: bool) -> Traffic:
        raise NotImplementedError(f"{self.name}: an op declared by examples has no memory floor")


def contract_dtypes(examples: Mapping[str, torch.Tensor], per_row: Sequence[str], count: int,
                    declared=None) -> tuple[tuple[torch.dtype, str], ...]:
    """Each floating-point output's dtype with where the rule took it from, as for a declared op
    (harness/ops/declared.py): the first floating-point per-row input's, else the first floating-point
    input's, else float32; `declared` (a dtype, or one per output) replaces the rule. Never the function's
    own first call: a function returning float64 would then set its own contract."""
    if declared is not None:
        found = (declared,) * count if isinstance(declared, torch.dtype) else tuple(declared)
        if len(found) != count or not all(isinstance(d, torch.dtype) for d in found):
            raise TypeError(f"out_dtype must be a torch.dtype or one per output ({count}), got {declared!r}")
        return tuple((d, "out_dtype=") for d in found)
    candidates = [n for n in per_row if examples[n].is_floating_point()] + \
        [n for n in examples if examples[n].is_floating_point()]
    if not candidates:
        return ((torch.float32, "no floating-point input: float32"),) * count
    name = candidates[0]
    where = "per-row input" if name in per_row else "input"
    return ((examples[name].dtype, f"the first floating-point {where}'s, {name!r}"),) * count


def output_specs(outputs: Sequence[torch.Tensor], rows: int, device: torch.device,
                 dtypes: Sequence[tuple[torch.dtype, str]] = ()) -> tuple[OutputSpec, ...]:
    """The per-row outputs one call on the examples gave, named `out` (one) or `out0`, `out1`, ...; a
    ValueError naming the output when one is not per-row (its first dimension is not `rows`), is not on
    the examples' `device`, or is floating-point in another dtype than the contract's (`dtypes`, from
    `contract_dtypes`: the dtype and where it comes from, per output)."""
    names = ["out"] if len(outputs) == 1 else [f"out{i}" for i in range(len(outputs))]
    specs = []
    for k, (name, out) in enumerate(zip(names, outputs)):
        if out.dim() == 0 or out.shape[0] != rows:
            raise ValueError(f"contract: output {name!r} has shape {tuple(out.shape)}; every output's first "
                             f"dimension must be the rows ({rows}, the per-row inputs' first dimension)")
        if out.device != device:
            raise ValueError(f"contract: output {name!r} is on {out.device}, the inputs on {device}")
        dtype = out.dtype
        if k < len(dtypes) and (out.is_floating_point() or dtypes[k][1] == "out_dtype="):
            dtype, source = dtypes[k]
            if out.dtype != dtype:
                raise ValueError(f"contract: output {name!r} is {out.dtype}, the contract's dtype is {dtype} "
                                 f"({source}; out_dtype= declares another)")
        specs.append(OutputSpec(name=name, trailing=tuple(out.shape[1:]), dtype=dtype))
    return tuple(specs)
