"""GEMM1 of timestep_mlp (float64 MMA) on other tiles: the same bits as the default's tile, and its speed.

    python -m tools.probe_fwd1 [--rows 1,2,3,4,8,13,16] [--configs M16N32K32W1,...] [--json FILE]

GEMM1 (z1 = x W1^T + b1, h = silu(z1); K = 256) runs in float64 on sm_90's fp64 MMA (mma.sync m8n8k4):
products of fp32 values are exact in float64, and each output's sum runs over k ascending, k4 by k4, into
one float64 accumulator. If the hardware's k4 step is one fixed function of (accumulator, 4 products),
the tile's M, N and BLOCK_K, the warps and the stages cannot change an output's bits, and GEMM1 may take
other tiles at small T (as the FMA chains do, kernels/gemm.py). That is the hardware's: this checks it,
bitwise, for each candidate and T against (a) the default config on the same rows and (b) the same rows
as the first T rows of a T = 2048 batch under the default, for h (the no-grad launch) and for z1 and h
(the autograd launch, `save_pre`), on four data sets:
  model     the op's own inputs (harness/ops/timestep_mlp.py)
  spread    x and W1 with every element scaled by 2^U{-12..12} (a sum's addends far apart in exponent)
  rows      each row of x and of W1 scaled by 2^U{-30..30}, one row of x all zero, one of tiny values
  cancel    x's rows in +v / -v pairs along k (sums near zero)
Then each config's kernel time per call at each T (the no-grad launch). GPU only.
"""
from __future__ import annotations


import torch

from tools import bitwise_probe as BP
from tools.bitwise_probe import BIG_T


def candidates() -> dict:
    from h3bench.kernels.gemm import LaunchConfig as C
    f = {"precision": "fp64"}
    return {
        "M16N32K32W1S3": C(16, 32, 32, num_warps=1, num_stages=3, **f),
        "M16N32K32W2S3": C(16, 32, 32, num_warps=2, num_stages=3, **f),
        "M16N16K32W1S4": C(16, 16, 32, num_warps=1, num_stages=4, **f),
        "M16N16K64W1S3": C(16, 16, 64, num_warps=1, num_stages=3, **f),
        "M16N32K64W2S3": C(16, 32, 64, num_warps=2, num_stages=3, **f),
        "M16N64K32W2S3": C(16, 64, 32, num_warps=2, num_stages=3, **f),
        "M32N16K32W2S3": C(32, 16, 32, num_warps=2, num_stages=3, **f),
        "M32N32K64W4S3": C(32, 32, 64, num_warps=4, num_stages=3, **f),
        "M32N32K128W4S2": C(32, 32, 128, num_warps=4, num_stages=2, **f),
        "M32N32K32W4S4": C(32, 32, 32, num_warps=4, num_stages=4, **f),
        "M16N8K32W1S4": C(16, 8, 32, num_warps=1, num_stages=4, **f),
        "M16N8K64W1S4": C(16, 8, 64, num_warps=1, num_stages=4, **f),
        "M16N16K64W1S5": C(16, 16, 64, num_warps=1, num_stages=5, **f),
    }


def data_sets(device: torch.device) -> dict:
    """{name: (x [BIG_T, F], w1 [Hd, F], b1 [Hd])}: tools/bitwise_probe.py's four sets around the op's x."""
    from h3bench.harness.config import load_config
    from h3bench.harness.ops import get_op
    params = load_config("timestep_mlp").inputs
    inputs = get_op("timestep_mlp").make_inputs(params, BIG_T, 11, device)
    x, w1, b1 = (inputs.tensors[n] for n in ("x", "w1", "b1"))
    return BP.data_sets(x, w1, b1, seed=7, spread=12, row_spread=30, tiny=2.0 ** -100)


def run(cfg, x, w1, b1) -> tuple:
    """(h, z1, h): the no-grad launch's h, then the autograd launch's z1 and h (`save_pre`)."""
    from h3bench.kernels import gemm
    h, _ = gemm.forward(x, w1, b1, cfg, out_dtype=torch.float32, out_silu=True)
    return (h,) + gemm.forward(x, w1, b1, cfg, out_dtype=torch.float32, out_silu=True, save_pre=True)[::-1]


def run_no_grad(cfg, x, w1, b1) -> tuple:
    from h3bench.kernels import gemm
    return (gemm.forward(x, w1, b1, cfg, out_dtype=torch.float32, out_silu=True)[0],)


def _default():
    from h3bench.kernels import gemm
    from h3bench.kernels import timestep_mlp as TM
    return gemm.pick(TM.DEFAULT.fwd1, BIG_T)


def main(argv=None) -> dict:
    return BP.main(argv, __doc__.splitlines()[0], candidates(), _default, data_sets, run, time_run=run_no_grad)


if __name__ == "__main__":
    main()
