"""Small models for the localisation's tests: exact arithmetic (inputs, weights and upstream gradients on
a grid of quarters, so every product and sum is exact and any summation order, any BLAS kernel, gives the
same bits), with one fault planted in a torch.library custom op inside one module: batch-variant in forward,
in backward only, dependent on the row's position, or different from run to run."""
from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch import nn

NAMESPACE = "h3plant"
STEP = 2.0 ** -12
_calls = itertools.count()


def _quarters(t: torch.Tensor) -> torch.Tensor:
    return torch.round(t * 4) / 4


@torch.library.custom_op(f"{NAMESPACE}::batch_scale", mutates_args=())
def batch_scale(x: torch.Tensor) -> torch.Tensor:
    return x * (1 + STEP * (x.shape[0] - 1))


@batch_scale.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::grad_batch_scale", mutates_args=())
def grad_batch_scale(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@grad_batch_scale.register_fake
def _(x):
    return torch.empty_like(x)


grad_batch_scale.register_autograd(lambda ctx, g: batch_scale(g))


@torch.library.custom_op(f"{NAMESPACE}::position_shift", mutates_args=())
def position_shift(x: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(x.shape[0], dtype=x.dtype, device=x.device).reshape(-1, *[1] * (x.dim() - 1))
    return x + STEP * positions


@position_shift.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::run_shift", mutates_args=())
def run_shift(x: torch.Tensor) -> torch.Tensor:
    return x + STEP * (next(_calls) % 7)


@run_shift.register_fake
def _(x):
    return torch.empty_like(x)


for _op in (batch_scale, position_shift, run_shift):
    _op.register_autograd(lambda ctx, g: g)

FAULTS = {"forward": batch_scale, "backward": grad_batch_scale, "position": position_shift, "repeat": run_shift}
OP_NAMES = {"forward": f"{NAMESPACE}::batch_scale", "backward": f"{NAMESPACE}::grad_batch_scale",
            "position": f"{NAMESPACE}::position_shift", "repeat": f"{NAMESPACE}::run_shift"}


class _GradOnGrid(torch.autograd.Function):
    """Identity forward; the upstream gradient rounded to quarters, so backward stays exact."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _quarters(g)


class Fault(nn.Module):
    def __init__(self, kind: Optional[str]):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        return FAULTS[self.kind](x) if self.kind else x


class Block(nn.Module):
    def __init__(self, width: int, fault: Optional[str] = None):
        super().__init__()
        self.up = nn.Linear(width, 2 * width, bias=False)
        self.gate = Fault(fault)
        self.down = nn.Linear(2 * width, width, bias=False)

    def forward(self, x):
        return x + self.down(self.gate(torch.relu(self.up(x))))


class PlantedModel(nn.Module):
    """x [R, T, width] -> [R, T, width]; `fault` (a FAULTS key) planted in `blocks.<where>.gate`."""

    def __init__(self, width: int = 8, fault: Optional[str] = None, where: int = 1):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, fault if i == where else None) for i in range(2))
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randint(-1, 2, p.shape, generator=gen).float() / 4)

    def forward(self, x):
        x = x + (_quarters(x) - x).detach()  # on the grid, gradient passed through unchanged
        for block in self.blocks:
            x = block(x)
        return _GradOnGrid.apply(x)


def examples(rows: int = 4, tokens: int = 3, width: int = 8) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {"x": (torch.randn(rows, tokens, width, generator=gen) * 2).requires_grad_()}


def build_honest(device):
    """A factory for `h3bench model`: the exact model, no fault."""
    return PlantedModel().to(device), {k: v.to(device) for k, v in examples().items()}, ["x"]


def build_forward(device):
    """A factory for `h3bench model`: the forward fault in blocks.1.gate."""
    return PlantedModel(fault="forward").to(device), {k: v.to(device) for k, v in examples().items()}, ["x"]


def build_raises(device):
    raise RuntimeError("no weights here")


def build_wrong(device):
    return PlantedModel()


def build_uneven(device):
    return PlantedModel(), {"x": torch.zeros(3, 2, 8), "y": torch.zeros(4, 2, 8)}, ["x", "y"]


def build_scalar_output(device):
    return (lambda x: {"y": x, "loss": x.sum()}), examples(), ["x"]
