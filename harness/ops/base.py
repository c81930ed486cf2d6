"""What the probes need to know about an operator, and nothing about any implementation.

An op names its inputs, says which are per-row (sliced by the probes: a "row" is one row of each of
them) and which are parameters (their gradients are cross-row sums: only repeatability is checked),
makes seeded inputs, computes the float64 reference and knows its memory floor.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol

import torch


@dataclass(frozen=True)
class OpInputs:
    """The named tensors of one case, in call order. Row tensors share their first dimension."""

    tensors: Mapping[str, torch.Tensor]
    row_names: tuple[str, ...]

    @property
    def rows(self) -> int:
        return self.tensors[self.row_names[0]].shape[0]

    def select_rows(self, index: torch.Tensor) -> "OpInputs":
        """The same case restricted to `index` rows, in that order, as fresh tensors; parameters shared."""
        picked = {name: (t.index_select(0, index) if name in self.row_names else t)
                  for name, t in self.tensors.items()}
        return OpInputs(tensors=picked, row_names=self.row_names)


@dataclass
class Reference:
    """float64 output and the float64 gradients asked for."""

    output: torch.Tensor
    grads: dict[str, torch.Tensor] = field(default_factory=dict)


class Op(Protocol):
    """The contract an operator module fulfils (see harness/ops/norm_modulate.py)."""

    name: str
    rfc: str
    differentiable: tuple[str, ...]   # inputs that can have gradients, in call order
    row_grad: str                     # the per-row gradient the probes compare bitwise
    param_grads: tuple[str, ...]      # cross-row gradients: repeatability only
    references: tuple[str, ...]       # reference variants; the first is the op itself
    params_type: type                 # dataclass of the op's config keys

    def make_inputs(self, params: Any, rows: int, seed: int, device: torch.device) -> OpInputs: ...

    def make_grad_out(self, params: Any, rows: int, seed: int, device: torch.device) -> torch.Tensor: ...

    def reference(self, params: Any, inputs: OpInputs, grad_out: Optional[torch.Tensor],
                  grads: tuple[str, ...], variant: str) -> Reference: ...

    def floor_bytes(self, params: Any, rows: int, backward: bool) -> int: ...
