"""Kernel-level check and timing of norm_modulate variants, for tuning on the GPU (not a probe).

    python -m kernels.bench --rows 32768 --hidden 5376 --out bench.json

For each variant (forward warps, backward warps, backward programs per SM) it checks the result
against float64 and times, with CUDA events (median of --reps after --warmup), the forward launcher,
backward without and with the parameter stage, and the autograd round
trip. Every variant is timed twice; the spread between the two says what difference is noise.
"""
from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import asdict, dataclass

import torch

from harness.environment import measure_copy_bandwidth
from harness.ops.norm_modulate import OP, NormModulateParams
from harness.execute import as_bits
from harness.probes.accuracy_latency import rel_err
from harness.timing import sample
from kernels import launch as launch_mod
from kernels import norm_modulate as K
from kernels.api import norm_modulate


@dataclass
class VariantResult:
    fwd_warps: int
    bwd_warps: int
    programs_per_sm: int
    fwd_err: float
    grad_err: dict
    fwd_us: list
    fast_launch: bool
    digest: dict  # a weighted sum of the output and gradient bits: fast and plain launches must agree
    bwd_dx_us: list
    bwd_us: list
    fwd_bwd_us: list


def _digest(t: torch.Tensor) -> int:
    bits = as_bits(t.detach()).reshape(-1).long()
    return int((bits * (torch.arange(bits.numel(), device=bits.device) % 65521 + 1)).sum())


def _time(fn, warmup, reps, repeats=2):
    dev = torch.device("cuda")
    return [round(sample(fn, dev, warmup, reps).median_us, 2) for _ in range(repeats)]


def run_variant(inputs, dy, params, fwd_warps, bwd_warps, pps, warmup, reps) -> VariantResult:
    K.WARPS_OVERRIDE.update(fwd=fwd_warps, bwd=bwd_warps)
    K.block_config.cache_clear()
    K.BWD_PROGRAMS_PER_SM = pps
    t = inputs.tensors
    x, w, sh, sc, idx = (t[n] for n in ("x", "w", "sh", "sc", "idx"))
    leaves = [v.detach().requires_grad_() for v in (x, w, sh, sc)]
    y = norm_modulate(*leaves, idx)
    y.backward(dy)
    ref = OP.reference(params, inputs, dy, ("x", "w", "sh", "sc"))
    grad_err = {n: rel_err(l.grad, ref.grads[n]) for n, l in zip(("x", "w", "sh", "sc"), leaves)}
    fwd_err = rel_err(y, ref.output)
    digest = {n: _digest(t) for n, t in [("y", y)] + [(n, l.grad) for n, l in zip(("x", "w", "sh", "sc"), leaves)]}
    del ref, y

    _, rstd = K.forward(x, w, sh, sc, idx, 1e-5)
    table_rows = sh.shape[0]
    cfg = K.block_config(x.shape[1])

    def step_fwd_bwd():
        for leaf in leaves:
            leaf.grad = None
        norm_modulate(*leaves, idx, check_index=False).backward(dy)

    return VariantResult(
        fwd_warps=fwd_warps, bwd_warps=bwd_warps, programs_per_sm=pps, fwd_err=fwd_err, grad_err=grad_err,
        fwd_us=_time(lambda: K.forward(x, w, sh, sc, idx, 1e-5), warmup, reps),
        fast_launch=launch_mod.ENABLED, digest=digest,
        bwd_dx_us=_time(lambda: K.backward(dy, x, w, sc, idx, rstd, table_rows, sh.dtype, False), warmup, reps),
        bwd_us=_time(lambda: K.backward(dy, x, w, sc, idx, rstd, table_rows, sh.dtype, True), warmup, reps),
        fwd_bwd_us=_time(step_fwd_bwd, warmup, reps),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=5376)
    parser.add_argument("--fwd-warps", default="4")
    parser.add_argument("--bwd-warps", default="8")
    parser.add_argument("--programs-per-sm", default="1")
    parser.add_argument("--fast-launch", default="1,0", help="1: kernels.launch fast path, 0: kernel[grid]")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dev = torch.device("cuda")
    bandwidth, _ = measure_copy_bandwidth(dev)
    params = NormModulateParams(hidden=args.hidden)
    inputs = OP.make_inputs(params, args.rows, 11, dev)
    dy = OP.make_grad_out(params, args.rows, 9, dev)
    floor_fwd = OP.floor_bytes(params, args.rows, False) / (bandwidth * 1e3)
    floor_all = OP.floor_bytes(params, args.rows, True) / (bandwidth * 1e3)
    ints = lambda s: [int(v) for v in s.split(",")]
    results = []
    print(f"copy bandwidth {bandwidth:.1f} GB/s; floor fwd {floor_fwd:.1f} us, fwd+bwd {floor_all:.1f} us")
    print(f"{'fw':>3} {'bw':>3} {'pps':>3} | {'fwd us':>15} {'fast':>4} {'bwd dx':>15} {'bwd':>15} "
          f"{'fwd+bwd':>15} | fwd% net% | fwd err, max grad err")
    for fw, bw, pps, fast in itertools.product(ints(args.fwd_warps), ints(args.bwd_warps), ints(args.programs_per_sm),
                                               ints(args.fast_launch)):
        launch_mod.ENABLED = bool(fast)
        try:
            r = run_variant(inputs, dy, params, fw, bw, pps, args.warmup, args.reps)
        except Exception as exc:  # a variant that fails to compile is a line in the table
            print(f"{fw:>3} {bw:>3} {pps:>3} | failed: {type(exc).__name__}: {str(exc)[-300:]}")
            continue
        results.append(r)
        print(f"{fw:>3} {bw:>3} {pps:>3} | {r.fwd_us[0]:>7.1f}/{r.fwd_us[1]:<7.1f} {fast:>4} "
              f"{r.bwd_dx_us[0]:>7.1f}/{r.bwd_dx_us[1]:<7.1f} {r.bwd_us[0]:>7.1f}/{r.bwd_us[1]:<7.1f} "
              f"{r.fwd_bwd_us[0]:>7.1f}/{r.fwd_bwd_us[1]:<7.1f} | {floor_fwd / r.fwd_us[0]:.0%} "
              f"{floor_all / r.fwd_bwd_us[0]:.0%} | {r.fwd_err:.2e}, {max(r.grad_err.values()):.2e}", flush=True)
    digests = {}
    for r in results:
        digests.setdefault((r.fwd_warps, r.bwd_warps, r.programs_per_sm), []).append(r.digest)
    for cfg, found in digests.items():
        print(f"fast and plain launch bitwise equal {cfg}: {all(d == found[0] for d in found)}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"bandwidth_gbps": bandwidth, "rows": args.rows, "hidden": args.hidden,
                       "floor_fwd_us": floor_fwd, "floor_fwd_bwd_us": floor_all,
                       "gpu": torch.cuda.get_device_name(), "variants": [asdict(r) for r in results]}, handle,
                      indent=1)


if __name__ == "__main__":
    main()
