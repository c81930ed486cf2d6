"""`F.linear(x, w)`: torch's own projection (aten mm through cuBLAS on a GPU), the op's plain composition
(the negative control's too), gradients for x and w from autograd. The global modes (`--mode`) replace the
aten mm this row reaches, so it is measured under each as `torch[<mode>]`."""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.linear import LinearParams


def _load(device: torch.device, params: LinearParams) -> Loaded:
    import torch.nn.functional as F

    def linear(x, w):
        return F.linear(x, w)

    return Loaded(fn=linear, source=f"torch {torch.__version__} F.linear (no bias)")


ADAPTER = Adapter(name="torch", op="linear", grads=("x", "w"), load=_load, summary="torch F.linear")
