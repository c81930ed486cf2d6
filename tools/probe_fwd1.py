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

import argparse
import json
import sys

import torch

BIG_T = 2048


def candidates() -> dict:
    from kernels.gemm import LaunchConfig as C
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
    """{name: (x [BIG_T, F], w1 [Hd, F], b1 [Hd])}."""
    from harness.config import load_config
    from harness.ops import get_op
    params = load_config("timestep_mlp").inputs
    inputs = get_op("timestep_mlp").make_inputs(params, BIG_T, 11, device)
    x, w1, b1 = (inputs.tensors[n] for n in ("x", "w1", "b1"))
    g = torch.Generator(device=device).manual_seed(7)

    def pow2(shape, lo, hi):
        return torch.exp2(torch.randint(lo, hi + 1, shape, generator=g, device=device).float())

    out = {"model": (x, w1, b1)}
    out["spread"] = (x * pow2(x.shape, -12, 12), w1 * pow2(w1.shape, -12, 12), b1)
    xr = x * pow2((x.shape[0], 1), -30, 30)
    xr[1] = 0.0
    xr[2] = x[2] * 2.0 ** -100
    out["rows"] = (xr, w1 * pow2((w1.shape[0], 1), -30, 30), b1)
    half = x[:, : x.shape[1] // 2]
    out["cancel"] = (torch.cat([half, -half * (1 + 2.0 ** -20)], dim=1).contiguous(), w1, b1)
    return out


def run(cfg, x, w1, b1, save_pre: bool):
    from kernels import gemm
    return gemm.forward(x, w1, b1, cfg, out_dtype=torch.float32, out_silu=True, save_pre=save_pre)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,3,4,8,13,16")
    ap.add_argument("--configs", default=",".join(candidates()))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("probe_fwd1 needs a GPU (the claim it checks is the fp64 MMA's)")
    from kernels import gemm
    from kernels import timestep_mlp as TM
    from tools.probe_swap_ab import kernel_us
    device = torch.device("cuda")
    default = gemm.pick(TM.DEFAULT.fwd1, BIG_T)
    cands = {name: candidates()[name] for name in args.configs.split(",") if name}
    rows = [int(r) for r in args.rows.split(",")]
    sets = data_sets(device)

    def same(got, want) -> bool:
        return all(torch.equal(a, b) for a, b in zip(got, want) if a is not None)

    records = []
    for data, (x, w1, b1) in sets.items():
        big = {sp: run(default, x, w1, b1, sp) for sp in (False, True)}
        for t in rows:
            xt = x[:t].clone()
            alone = {sp: run(default, xt, w1, b1, sp) for sp in (False, True)}
            rec = {"data": data, "rows": t,
                   "default_alone_equals_big": all(same(alone[sp], tuple(v[:t] if v is not None else None for v in big[sp]))
                                                   for sp in (False, True))}
            for name, cfg in cands.items():
                try:
                    got = {sp: run(cfg, xt, w1, b1, sp) for sp in (False, True)}
                    rec[name] = {
                        "equal_default": all(same(got[sp], alone[sp]) for sp in (False, True)),
                        "equal_big": all(same(got[sp], tuple(v[:t] if v is not None else None for v in big[sp]))
                                         for sp in (False, True)),
                        "differing_h": int((got[False][0] != alone[False][0]).sum().item())}
                except Exception as exc:   # a candidate that fails to compile is a record, not the end of the run
                    rec[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            records.append(rec)
            print(json.dumps(rec), flush=True)
    timings = []
    x, w1, b1 = sets["model"]
    for t in rows:
        xt = x[:t].clone()
        rec = {"rows": t, "default": kernel_us(lambda: run(default, xt, w1, b1, False), args.reps)}
        for name, cfg in cands.items():
            try:
                rec[name] = kernel_us(lambda: run(cfg, xt, w1, b1, False), args.reps)
            except Exception as exc:
                rec[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        timings.append(rec)
        print("kernel us", json.dumps(rec), flush=True)
    all_equal = all(v.get("equal_default") and v.get("equal_big") for r in records for k, v in r.items()
                    if isinstance(v, dict) and "error" not in v)
    result = {"device": torch.cuda.get_device_name(), "default": default.short(),
              "configs": {k: v.short() for k, v in cands.items()}, "bitwise": records, "kernel_us": timings,
              "every_candidate_bitwise_equal": all_equal}
    print("every candidate bitwise equal to the default (alone and as rows of T = 2048):", all_equal)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
