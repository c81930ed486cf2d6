"""Every built-in op declares what `h3bench list --op` prints for a newcomer writing an --adapter: its
formula, and each input's and output's shape in words, which must be the shapes the op really makes."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from h3bench.harness.config import load_config
from h3bench.harness.ops import OP_MODULES, get_op

BUILTIN_OPS = [op for op, module in OP_MODULES.items() if module.startswith("h3bench.harness.ops.")]
# sizes that differ from each other, so a shape naming the wrong size cannot match by accident
DISTINCT = {"hidden": 40, "temb_dim": 24, "timesteps": 5, "freq_dim": 12}


def _evaluate(shape: tuple[str, ...], rows: int, params) -> list[int]:
    names = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    return [eval(dim, {"__builtins__": {}}, {"R": rows, **names}) for dim in shape]


@pytest.mark.parametrize("op", BUILTIN_OPS)
def test_declared_shapes_are_the_shapes_the_op_makes(op):
    spec = get_op(op)
    assert spec.formula and "\n" not in spec.formula
    assert all(i.shape for i in spec.inputs) and len(spec.output_shapes) == len(spec.outputs)
    quick = load_config(op, quick=True).inputs
    for params in (quick, dataclasses.replace(quick, **{k: v for k, v in DISTINCT.items() if hasattr(quick, k)})):
        for rows in (3, 7):
            tensors = spec.make_inputs(params, rows, 0, torch.device("cpu")).tensors
            for i in spec.inputs:
                assert list(tensors[i.name].shape) == _evaluate(i.shape, rows, params), (op, i.name, params)
            outs = spec.make_grad_outs(params, rows, 0, torch.device("cpu"))
            for name, shape, g in zip(spec.outputs, spec.output_shapes, outs):
                assert list(g.shape) == _evaluate(shape, rows, params), (op, name, params)
