"""norm_modulate, the MiniMax-H3 DiT block's norm1/norm2 (RL-Align/RL-Kernel RFC #420).

    n = rms_norm(x, w, eps)              x: [R, H], w: [H]
    y = n * (1 + sc[idx]) + sh[idx]      sh, sc: [M, H] views of a [M, 6H] AdaLN table, idx: [R]

Inputs follow the prior art (shared/prior-art/README.md) so numbers compare: x = 2 randn, w = 0.5 + rand,
tables 0.1 randn, all rounded to the working dtype; idx = timestep * 3 + modality with the first three
rows getting modalities 0, 1, 2. Dense tensors are drawn on the target device with a generator seeded
with the case seed (drawing 131072 x 5376 on the CPU would cost seconds per case); the layout is drawn
on the CPU as the prior art did.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from harness.ops.base import OpInputs, Reference

EPS = 1e-5
TABLE_CHUNKS = 6  # the AdaLN table holds six [M, H] chunks; sh and sc are two of them
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class NormModulateParams:
    hidden: int = 5376
    timesteps: int = 3
    modalities: int = 3
    dtype: str = "bfloat16"

    def __post_init__(self):
        if self.hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {self.hidden}")
        if self.timesteps < 1 or self.modalities < 1:
            raise ValueError("timesteps and modalities must be >= 1")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def table_rows(self) -> int:
        return self.timesteps * self.modalities

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]


class NormModulate:
    name = "norm_modulate"
    rfc = "RL-Align/RL-Kernel#420"
    differentiable = ("x", "w", "sh", "sc")
    row_grad = "x"
    param_grads = ("w", "sh", "sc")
    references = ("norm_modulate", "rms_norm")  # rms_norm: rows that implement the norm alone
    params_type = NormModulateParams

    def layout(self, params: NormModulateParams, rows: int, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        tags = torch.randint(0, params.modalities, (rows,), generator=gen)
        steps = torch.randint(0, params.timesteps, (rows,), generator=gen)
        first = min(rows, params.modalities)
        tags[:first] = torch.arange(first)
        return steps * params.modalities + tags

    def make_inputs(self, params: NormModulateParams, rows: int, seed: int,
                    device: torch.device) -> OpInputs:
        h, dtype = params.hidden, params.torch_dtype
        gen = torch.Generator(device=device).manual_seed(seed)
        x = (torch.randn(rows, h, generator=gen, device=device) * 2.0).to(dtype)
        w = (0.5 + torch.rand(h, generator=gen, device=device)).to(dtype)
        table = (torch.randn(params.table_rows, TABLE_CHUNKS * h, generator=gen, device=device) * 0.1).to(dtype)
        sh, sc = table.chunk(TABLE_CHUNKS, dim=-1)[:2]  # strided views, as in the model
        idx = self.layout(params, rows, seed).to(device)
        return OpInputs(tensors={"x": x, "w": w, "sh": sh, "sc": sc, "idx": idx}, row_names=("x", "idx"))

    def make_grad_out(self, params: NormModulateParams, rows: int, seed: int,
                      device: torch.device) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(seed)
        return torch.randn(rows, params.hidden, generator=gen, device=device).to(params.torch_dtype)

    def reference(self, params: NormModulateParams, inputs: OpInputs, grad_out: Optional[torch.Tensor],
                  grads: tuple[str, ...], variant: str = "norm_modulate") -> Reference:
        if variant not in self.references:
            raise ValueError(f"unknown reference variant {variant!r}; known: {self.references}")
        t = inputs.tensors
        leaves = {name: t[name].detach().double().requires_grad_(name in grads and grad_out is not None)
                  for name in self.differentiable}
        with torch.enable_grad():
            x, w = leaves["x"], leaves["w"]
            n = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * w
            if variant == "norm_modulate":
                idx = t["idx"]
                y = n * (1 + leaves["sc"].index_select(0, idx)) + leaves["sh"].index_select(0, idx)
            else:
                y = n
            out = Reference(output=y.detach())
            wanted = [name for name in grads if leaves[name].requires_grad]
            if wanted:
                found = torch.autograd.grad(y, [leaves[n] for n in wanted], grad_out.double(),
                                            allow_unused=True)
                out.grads = {name: g for name, g in zip(wanted, found) if g is not None}
        return out

    def floor_bytes(self, params: NormModulateParams, rows: int, backward: bool) -> int:
        """Fewest bytes through device memory: forward reads x and writes y; backward reads x and dy
        and writes dx. Tables, w and their gradients are O(M*H) and left out: 4RH / 10RH in bf16."""
        elem = torch.empty((), dtype=params.torch_dtype).element_size()
        passes = 5 if backward else 2
        return passes * elem * rows * params.hidden


OP = NormModulate()
