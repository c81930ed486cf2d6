"""adaln_projection, a MiniMax-H3 block's AdaLN projection (RL-Align/RL-Kernel RFC #420).

    table = W bf16(silu(temb)) + b     temb: [T, temb_dim] fp32, W: [out, temb_dim] bf16, b: [out] bf16
                                       -> table: [T, out] bf16,  out = chunks * modalities * hidden

diffusers' `MiniMaxH3AdaLayerNormModulation`: `nn.Linear(time_embed_dim, 6 * hidden_size *
MINIMAX_H3_MODALITY_NUM)` applied to `silu(temb).to(bf16)`; the model then views each timestep's row as
`modalities` rows of `chunks * hidden` (the [9, 6H] AdaLN table that splits into six chunks). At the
model's size out = 6 * 3 * 5376 = 18H = 96768. One per-row input (temb), two parameters; gradients for
all three. The GEMM op: every global mode applies (docs/operators.md, Modes).

The bf16 cast of silu(temb) is the implementations' business: the reference is the op's math in float64
with no intermediate rounding (no cast), as the RFC's reference.

Draws (docs/operators.md, "Common to all"): W and b are the same for every case, drawn once from a generator
seeded with PARAM_SEED (W first): W = randn * temb_dim^-0.5, b = 0.02 randn, rounded to bf16. temb = randn
(fp32) from the case seed. Everything is drawn on the target device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from h3bench.harness.ops.base import (Input, Op, OpInputs, Reference, Traffic, element_size, generator, positive_fields,
                              randn_grad_outs)

TEMB_DTYPE = torch.float32   # temb (the timestep MLP's fp32 output)
DTYPE = torch.bfloat16       # W, b and the table (the checkpoint's AdaLN projections are bf16)
PARAM_SEED = 0               # the parameters' generator seed: the same W, b in every case
BIAS_SCALE = 0.02


@dataclass(frozen=True)
class AdaLNProjectionParams:
    hidden: int       # the model width H (5376)
    temb_dim: int     # temb's width D (2688)
    chunks: int       # modulation chunks per (timestep, modality) row: shift/scale/gate x 2 (6)
    modalities: int   # table rows per timestep (3: video, text, audio)

    def __post_init__(self):
        positive_fields(self, "hidden", "temb_dim", "chunks", "modalities")

    @property
    def out_features(self) -> int:
        """W's rows and the table's width: chunks * modalities * hidden (18H = 96768)."""
        return self.chunks * self.modalities * self.hidden


class AdaLNProjection(Op):
    name = "adaln_projection"
    inputs = (Input("temb", per_row=True, differentiable=True, shape=("R", "temb_dim")),
              Input("w", differentiable=True, shape=("chunks*modalities*hidden", "temb_dim")),
              Input("b", differentiable=True, shape=("chunks*modalities*hidden",)))
    outputs = ("table",)
    output_shapes = (("R", "chunks*modalities*hidden"),)
    formula = "table = silu(temb) @ w.T + b"
    params_type = AdaLNProjectionParams
    plan_set = "timestep"
    mode_tagged_rows = ("diffusers",)  # `diffusers[<mode>]`, as the RFC names the row in every mode

    def parameters(self, params: AdaLNProjectionParams, device: torch.device) -> dict[str, torch.Tensor]:
        """W, b: the same in every case (PARAM_SEED)."""
        gen = generator(device, PARAM_SEED)
        w = torch.randn(params.out_features, params.temb_dim, generator=gen, device=device) * params.temb_dim ** -0.5
        b = torch.randn(params.out_features, generator=gen, device=device) * BIAS_SCALE
        return {"w": w.to(DTYPE), "b": b.to(DTYPE)}

    def make_inputs(self, params: AdaLNProjectionParams, rows: int, seed: int, device: torch.device) -> OpInputs:
        temb = torch.randn(rows, params.temb_dim, generator=generator(device, seed), device=device).to(TEMB_DTYPE)
        return self.bundle({"temb": temb, **self.parameters(params, device)})

    def make_grad_outs(self, params: AdaLNProjectionParams, rows: int, seed: int,
                       device: torch.device) -> tuple[torch.Tensor, ...]:
        return randn_grad_outs(rows, params.out_features, DTYPE, seed, device)

    def reference(self, params: AdaLNProjectionParams, inputs: OpInputs,
                  grad_outs: Optional[tuple[torch.Tensor, ...]], grads: tuple[str, ...], variant: str) -> Reference:
        def projection(leaves):
            temb, w, b = (leaves[n] for n in self.input_names)
            return ((temb * torch.sigmoid(temb)) @ w.T + b,)  # no bf16 cast: float64 throughout

        return self.float64_reference(inputs, grad_outs, grads, variant, projection)

    def floor_traffic(self, params: AdaLNProjectionParams, rows: int, backward: bool) -> Traffic:
        """temb fp32 (4 B), W, b and the table bf16 (2 B). With D = temb_dim, N = out_features:

        forward: per row read temb (4 D = 10752 B at the model's size) and write the table's row (2 N =
        193536 B); fixed, read W and b once: 2 (N D + N) = 520,418,304 B (520 MB).

        backward, added: per row read dy (2 N) and temb again (4 D, for dW = dy^T bf16(silu(temb)) and
        silu'): 204288 B, and write dtemb (4 D): 10752 B; fixed, read W again (dtemb needs dy W; b is not
        needed): 2 N D = 520,224,768 B, and write dW and db once: 2 (N D + N) = 520,418,304 B.

        So forward+backward reads 8 D + 2 N = 215,040 B per row + 1,040,643,072 B fixed and writes
        4 D + 2 N = 204,288 B per row + 520,418,304 B fixed.
        """
        act, par = element_size(TEMB_DTYPE), element_size(DTYPE)
        n, d = params.out_features, params.temb_dim
        read = rows * act * d + par * (n * d + n)
        written = rows * par * n
        if backward:
            read += rows * (par * n + act * d) + par * n * d
            written += rows * act * d + par * (n * d + n)
        return Traffic(read=read, written=written)


OP = AdaLNProjection()
