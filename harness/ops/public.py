"""The names a user writes to declare an operator of their own (`h3bench run --op ./my_op.py:MY_OP`).

A declaration is data: what the op's inputs are (per row or shared, with a gradient or not), what it
returns, its constants with their defaults, how to draw a case's inputs, and its math. Everything else
has a default, so a declaration needs no TOML file and no subclass:

    MY_OP = UserOp(
        name="my_rms_norm",
        inputs=(Input("x", per_row=True, differentiable=True), Input("weight", differentiable=True)),
        outputs=("y",),
        constants={"hidden": 64, "eps": 1e-6},
        make_inputs=make_inputs,   # (params, rows, seed, device) -> {"x": ..., "weight": ...}
        reference=reference,       # (x, weight, *, eps) -> y: the math, in whatever dtype it is given
    )

`reference` takes the inputs in call order (as every implementation does) and, as keyword arguments,
whichever constants it names; the harness evaluates it in float64 for the accuracy figures. The negative
control plants its fault into `composition` when the op gives one, else into `reference` evaluated in the
inputs' own dtype (harness/ops/declared.py). docs/examples/rms_norm_op.py is a complete example.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

import torch

from h3bench.harness.ops.base import Input, Traffic

# A probe plan: a built-in plan set's name (configs/plans/<name>.toml), a path to a TOML file of plan
# tables, or the tables themselves as a dict ({"all_rows": {...}, "full_vs_sub": {...}, ...}).
PlanSource = Union[str, Path, Mapping[str, Any]]
Tensors = Union[torch.Tensor, tuple]


@dataclass(frozen=True)
class UserOp:
    """An operator declared outside h3bench. Required: `name`, `inputs`, `outputs`, `constants`,
    `make_inputs`, `reference`; the rest is optional.

    - `constants`: name -> default (int, float, str or bool). They are the run's `[inputs]` config (`--set
      NAME=VALUE` changes one); `make_inputs` reads them as attributes of its `params` record, and the
      reference and every implementation receive, as keyword arguments, those they name.
    - `make_inputs(params, rows, seed, device)`: a dict of the inputs by name, drawn from `seed` only. The
      per-row inputs have `rows` rows (their first dimension); the shared ones are shared by every row of
      the case (a fixed seed for them, as in the example, makes them the same in every case too).
    - `reference(*inputs, **constants)`: the op's outputs, a tensor or a tuple in `outputs` order, each with
      the rows as its first dimension.
    - `composition`: an honest implementation in the inputs' dtype for the negative control (default: the
      reference in the inputs' dtype, each output cast to its contract dtype).
    - `plans`: the full plan (default: the built-in `token` plans: per-row ops at a model's counts);
      `quick_plans`: the quick one (default: the built-in `quick` plans). Each a PlanSource.
    - `make_grad_outs(params, rows, seed, device)`: one upstream gradient per output. Default: standard
      normal draws in the output's shape (from the reference) and in the dtype of the first floating-point
      per-row input; the outputs' contract (shape, dtype, device) follows from them.
    - `floor_traffic(params, rows, backward) -> Traffic`: the fewest bytes read and written, for the memory
      floors; without it the run has no floors.
    """

    name: str
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    constants: Mapping[str, Any]
    make_inputs: Callable[..., Mapping[str, torch.Tensor]]
    reference: Callable[..., Tensors]
    composition: Optional[Callable[..., Tensors]] = None
    plans: PlanSource = "token"
    quick_plans: PlanSource = "quick"
    make_grad_outs: Optional[Callable[..., tuple]] = None
    floor_traffic: Optional[Callable[..., Traffic]] = None
    description: str = field(default="")


__all__ = ["Input", "Traffic", "UserOp", "PlanSource"]
