"""GEMM2 of timestep_mlp swapped (`LaunchConfig.swap_ab`): the same bits as the default's tile, and its speed.

    python -m tools.probe_swap_ab [--rows 1,2,3,4,8,13,16] [--configs M64S4,M128S4,...] [--json FILE]

A swapped launch computes out^T = W2 h^T (W2's rows the MMA's M, the rows of h a narrow N tile) with the
same per-step scales, products, scale-backs and adds as the default's unswapped tile (kernels/gemm.py,
`_mainloop`). Whether the tensor core sums a step's products to the same bits whichever operand holds W2
and whatever the tile's shape is the hardware's: this checks it, bitwise, for each candidate config and
each T against (a) the default config on the same rows and (b) the same rows as the first T rows of a
T = 2048 batch under the default config (the batch-invariance claim itself), on four data sets:
  model     the op's own inputs (harness/ops/timestep_mlp.py parameters; h = silu(x W1^T + b1) by the
            default config, as the forward makes it)
  spread    h and W2 with every element scaled by 2^U{-12..12} (a step's products far apart in exponent:
            where a tensor core's alignment of its addends would show)
  rows      each row of h and of W2 scaled by 2^U{-40..40}, one row of h all zero, one of tiny values
  cancel    h's rows in +v / -v pairs along k (sums near zero: the last bits of a sum are its rounding)
Then each config's kernel time per call (torch.profiler, GEMM2's launch alone) at each T; with --diagnose
also configs of other orders and precisions, torch's copy of W2 and cuBLAS (timing only). GPU only.
"""
from __future__ import annotations

import json

import torch

from tools import bitwise_probe as BP
from tools.bitwise_probe import BIG_T


def candidates() -> dict:
    from h3bench.kernels.gemm import LaunchConfig as C
    s = {"precision": "fp16x3", "local_scales": True, "swap_ab": True, "split_k": 6}
    return {
        "M64S3": C(64, 16, 32, num_warps=4, num_stages=3, **s),
        "M64S4": C(64, 16, 32, num_warps=4, num_stages=4, **s),
        "M64S6": C(64, 16, 32, num_warps=4, num_stages=6, **s),
        "M128S3": C(128, 16, 32, num_warps=4, num_stages=3, **s),
        "M128S4": C(128, 16, 32, num_warps=4, num_stages=4, **s),
        "M128W8S4": C(128, 16, 32, num_warps=8, num_stages=4, **s),
        "M64N32S4": C(64, 32, 32, num_warps=4, num_stages=4, **s),
        # W2's rows on mma.sync (BLOCK_M < 64 or fewer than 4 warps: no wgmma): 1008 / 504 programs of 1-2 warps
        "M16W1S4": C(16, 16, 32, num_warps=1, num_stages=4, **s),
        "M16W1S6": C(16, 16, 32, num_warps=1, num_stages=6, **s),
        "M32W2S4": C(32, 16, 32, num_warps=2, num_stages=4, **s),
        # W2 split once (`presplit`): a step loads W2's halves and inverse scales instead of splitting its tile
        "M64S4PS": C(64, 16, 32, num_warps=4, num_stages=4, presplit=True, **s),
        "M16W1S4PS": C(16, 16, 32, num_warps=1, num_stages=4, presplit=True, **s),
        "M128S3PS": C(128, 16, 32, num_warps=4, num_stages=3, presplit=True, **s),
        # two steps an iteration (`pair_steps`): both split, then both steps' products, sums in step order
        "M64S4P2": C(64, 16, 32, num_warps=4, num_stages=4, pair_steps=True, **s),
        "M64S3P2": C(64, 16, 32, num_warps=4, num_stages=3, pair_steps=True, **s),
        "M64S2P2": C(64, 16, 32, num_warps=4, num_stages=2, pair_steps=True, **s),
        "M128S3P2": C(128, 16, 32, num_warps=4, num_stages=3, pair_steps=True, **s),
        "M16W1S4P2": C(16, 16, 32, num_warps=1, num_stages=4, pair_steps=True, **s),
        "M32W2S3P2": C(32, 16, 32, num_warps=2, num_stages=3, pair_steps=True, **s),
        # ... each step's two small products as one dot over K = 64 (`merge_products`: one wait fewer a step)
        "M64S4P2M": C(64, 16, 32, num_warps=4, num_stages=4, pair_steps=True, merge_products=True, **s),
        "M64S3P2M": C(64, 16, 32, num_warps=4, num_stages=3, pair_steps=True, merge_products=True, **s),
        # v8's tile (the default above 16 rows) paired: checked here at small T against the swapped default
        "U64N128S3P2": C(64, 128, 32, num_warps=4, num_stages=3, split_k=6, precision="fp16x3", local_scales=True,
                         pair_steps=True),
        "U64N128S3P2M": C(64, 128, 32, num_warps=4, num_stages=3, split_k=6, precision="fp16x3", local_scales=True,
                          pair_steps=True, merge_products=True),
        # the same tile unswapped (BLOCK_M 64 rows of h): a tile-shape check without the swap
        "U64N64S4": C(64, 64, 32, num_warps=4, num_stages=4, split_k=6, precision="fp16x3", local_scales=True),
    }


def data_sets(device: torch.device) -> dict:
    """{name: (h [BIG_T, K], w2 [D, K], b2 [D])}: tools/bitwise_probe.py's four sets around the op's h."""
    from h3bench.harness.config import load_config
    from h3bench.harness.ops import get_op
    from h3bench.kernels import gemm
    from h3bench.kernels import timestep_mlp as TM
    params = load_config("timestep_mlp").inputs
    inputs = get_op("timestep_mlp").make_inputs(params, BIG_T, 11, device)
    x, w1, b1, w2, b2 = (inputs.tensors[n] for n in ("x", "w1", "b1", "w2", "b2"))
    h, _ = gemm.forward(x, w1, b1, gemm.pick(TM.DEFAULT.fwd1, BIG_T), out_dtype=torch.float32, out_silu=True)
    return BP.data_sets(h, w2, b2, seed=5, spread=12, row_spread=40, tiny=2.0 ** -120)


def diagnostics() -> dict:
    """Configs that are not candidates (other orders, other precisions), timed only: where GEMM2's time at
    small T goes. Each k-step's split of W2's tile and its MMAs against plain streaming (FMA chains, tf32x3,
    longer steps, more K chunks), beside torch's copy of W2 and cuBLAS's gemv."""
    from h3bench.kernels.gemm import LaunchConfig as C
    s = {"precision": "fp16x3", "local_scales": True, "swap_ab": True}
    return {
        "swap_k64": C(64, 16, 64, num_warps=4, num_stages=3, split_k=6, **s),
        "swap_k32_split12": C(64, 16, 32, num_warps=4, num_stages=4, split_k=12, **s),
        "swap_k32_split21": C(64, 16, 32, num_warps=4, num_stages=4, split_k=21, **s),
        "fma_4x16x128": C(4, 16, 128, num_warps=1, num_stages=4),
        "fma_4x16x128_split6": C(4, 16, 128, num_warps=1, num_stages=4, split_k=6),
        "fma_16x32x64_split6": C(16, 32, 64, num_warps=2, num_stages=4, split_k=6),
        "tf32x3_64x64x32_split6": C(64, 64, 32, num_warps=4, num_stages=4, split_k=6, precision="tf32x3"),
    }


def diagnose(model: tuple, rows: list[int], reps: int) -> list[dict]:
    """`diagnostics()` and the references timed on `model` (data_sets()'s (h, w2, b2)) at each T."""
    from h3bench.kernels import gemm
    h, w2, b2 = model
    out = []
    for t in rows:
        ht = h[:t].clone()
        rec = {"rows": t, "copy_of_w2 (reads and writes)": BP.kernel_us(lambda: w2.clone(), reps),
               "presplit_of_w2 (once per weight version)": BP.kernel_us(lambda: gemm.presplit(w2, 32, 64), reps),
               "cublas_linear": BP.kernel_us(lambda: torch.nn.functional.linear(ht, w2, b2), reps)}
        for name, cfg in diagnostics().items():
            try:
                rec[name] = BP.kernel_us(lambda: gemm.forward(ht, w2, b2, cfg, out_dtype=torch.float32)[0], reps)
            except Exception as exc:
                rec[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        print("diagnostic kernel us", json.dumps(rec), flush=True)
        out.append(rec)
    return out


def _default():
    from h3bench.kernels import gemm
    from h3bench.kernels import timestep_mlp as TM
    return gemm.pick(TM.DEFAULT.fwd2, BIG_T)


def run(cfg, h, w2, b2) -> tuple:
    from h3bench.kernels import gemm
    return (gemm.forward(h, w2, b2, cfg, out_dtype=torch.float32)[0],)


def main(argv=None) -> dict:
    return BP.main(argv, __doc__.splitlines()[0], candidates(), _default, data_sets, run, diagnose=diagnose)


if __name__ == "__main__":
    main()
