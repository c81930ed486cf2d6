"""What every probe receives: the op, its parameters, one loaded implementation, the device."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from harness.adapter import OpCallable
from harness.execute import Outcome, execute
from harness.ops.base import Op, OpInputs

Progress = Callable[[int], None]  # advance by n units of the probe's declared total


def _no_progress(_n: int) -> None:
    pass


@dataclass
class ProbeContext:
    op: Op
    params: Any
    fn: OpCallable
    grads: tuple[str, ...]
    device: torch.device
    reference_variant: str
    progress: Progress = field(default=_no_progress)

    @property
    def row_grad(self) -> Optional[str]:
        return self.op.row_grad if self.op.row_grad in self.grads else None

    @property
    def param_grads(self) -> tuple[str, ...]:
        return tuple(g for g in self.op.param_grads if g in self.grads)

    def inputs(self, rows: int, seed: int) -> OpInputs:
        return self.op.make_inputs(self.params, rows, seed, self.device)

    def grad_out(self, rows: int, seed: int) -> torch.Tensor:
        return self.op.make_grad_out(self.params, rows, seed, self.device)

    def run(self, inputs: OpInputs, grad_out: torch.Tensor) -> Outcome:
        return execute(self.fn, inputs, grad_out, self.grads)

    def rows_index(self, rows: list[int] | range) -> torch.Tensor:
        return torch.as_tensor(list(rows), dtype=torch.long, device=self.device)
