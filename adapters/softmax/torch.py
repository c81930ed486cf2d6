"""`torch.softmax(x, dim=-1)`: torch's own softmax, the op's plain composition (the negative control's
too), gradient for x from autograd."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.softmax import SoftmaxParams


def _load(device: torch.device, params: SoftmaxParams) -> Loaded:
    def softmax(x):
        return torch.softmax(x, dim=-1)

    return Loaded(fn=softmax, source=f"torch {torch.__version__} torch.softmax(dim=-1)")


ADAPTER = Adapter(name="torch", op="softmax", grads=("x",), load=_load, summary="torch.softmax")
