"""A toy second op for the tests: two per-row inputs with gradients, a table, an index, two outputs.

    mixed = a * (1 + s[idx]) + b       product = a * b

It proves that nothing in harness/ or reports/ assumes norm_modulate's tensors: its rows run through the
whole quick plan (tests/test_toy_op.py). Registered with harness.ops.register; its configs live in
tests/data/toy_two_outputs/.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from h3bench.harness.ops.base import (Input, Op, OpInputs, Reference, Traffic, float64_leaves, generator, positive,
                              reference_grads)


@dataclass(frozen=True)
class ToyParams:
    width: int
    table_rows: int

    def __post_init__(self):
        positive("width", self.width)
        positive("table_rows", self.table_rows)


class ToyTwoOutputs(Op):
    name = "toy_two_outputs"
    inputs = (Input("a", per_row=True, differentiable=True), Input("s", differentiable=True),
              Input("b", per_row=True, differentiable=True), Input("idx", per_row=True))
    outputs = ("mixed", "product")
    params_type = ToyParams
    plan_set = "token"
    config_dir = Path(__file__).parent / "data" / "toy_two_outputs"

    def make_inputs(self, params: ToyParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        gen = generator(device, seed)
        a = torch.randn(rows, params.width, generator=gen, device=device).to(torch.bfloat16)
        b = torch.randn(rows, params.width, generator=gen, device=device).to(torch.bfloat16)
        s = (0.1 * torch.randn(params.table_rows, params.width, generator=generator(device, 0), device=device)
             ).to(torch.bfloat16)
        idx = torch.randint(0, params.table_rows, (rows,), generator=torch.Generator().manual_seed(seed)).to(device)
        return self.bundle({"a": a, "s": s, "b": b, "idx": idx})

    def make_grad_outs(self, params: ToyParams, rows: int, seed: int, device: torch.device):
        gen = generator(device, seed)
        return tuple(torch.randn(rows, params.width, generator=gen, device=device).to(torch.bfloat16)
                     for _ in self.outputs)

    def reference(self, params: ToyParams, inputs: OpInputs, grad_outs: Optional[tuple], grads: tuple[str, ...],
                  variant: str) -> Reference:
        if variant != self.name:
            raise ValueError(f"unknown reference variant {variant!r}")
        leaves = float64_leaves(inputs, self.differentiable, grads, grad_outs is not None)
        with torch.enable_grad():
            a, s, b, idx = (leaves[n] for n in ("a", "s", "b", "idx"))
            outs = (a * (1 + s.index_select(0, idx)) + b, a * b)
            found = reference_grads(outs, leaves, grad_outs, grads)
        return Reference(outputs=tuple(o.detach() for o in outs), grads=found)

    def floor_traffic(self, params: ToyParams, rows: int, backward: bool) -> Traffic:
        # bf16 [rows, width] passes: the forward reads a, b and writes both outputs; the backward adds reads
        # of a, b and both upstream gradients and writes of da, db (the table s is left out).
        one_pass = 2 * rows * params.width
        if backward:
            return Traffic(read=6 * one_pass, written=4 * one_pass)
        return Traffic(read=2 * one_pass, written=2 * one_pass)


OP = ToyTwoOutputs()


def composition(a, s, b, idx):
    return a * (1 + s.index_select(0, idx)) + b, a * b
