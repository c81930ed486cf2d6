"""Kernel-level check and timing of norm_modulate launch configurations, for tuning on the GPU (not a probe).

    python -m tools.bench_norm_modulate --rows 32768 --hidden 5376 --out bench.json
    python -m tools.bench_norm_modulate --hidden 1024 --variants default,gather,gather-l1 --fwd-warps 4,8

Each variant is a LaunchConfig: the presets of tools/sweep_norm_modulate.py (--variants), each crossed with
the warp and programs-per-SM overrides given (--fwd-warps, --bwd-warps, --programs-per-sm; empty: the
preset's own) and the launch path (--fast-launch: kernels/common.py's fast launcher, or triton's own).
Per variant: the result against float64 and a digest of the output and gradient bits (fast and plain
launches must agree), then, with CUDA events (`harness.timing.take`, median of --reps after --warmup,
per-sample synchronized unless --method stream), the forward launcher, the backward without and with the
parameter stage, and the autograd round trip. Every figure is timed twice; the spread between the two
says what difference is noise.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from dataclasses import asdict, dataclass

import torch

from h3bench.harness.execute import as_bits
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.harness.timing import SYNCHRONIZED, median, take
from h3bench.kernels import common
from h3bench.kernels import norm_modulate_kernel as K
from h3bench.kernels.norm_modulate_api import norm_modulate
from tools.sweep_norm_modulate import _variant, _variant_names, make_case, using_config

NAMES = ("x", "w", "sh", "sc")


@dataclass
class VariantResult:
    variant: str
    config: dict
    fast_launch: bool
    fwd_err: float
    grad_err: dict
    digest: dict  # a weighted sum of the output and gradient bits: fast and plain launches must agree
    fwd_us: list
    bwd_dx_us: list
    bwd_us: list
    fwd_bwd_us: list


def _digest(t: torch.Tensor) -> int:
    bits = as_bits(t.detach()).reshape(-1).long()
    return int((bits * (torch.arange(bits.numel(), device=bits.device) % 65521 + 1)).sum())


def _time(fn, warmup: int, reps: int, method: str, setup=None, repeats: int = 2) -> list[float]:
    dev = torch.device("cuda")
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    return [round(median(take(fn, dev, method, reps, setup)), 2) for _ in range(repeats)]


def run_variant(name: str, cfg: K.LaunchConfig, params, t: dict, dy: torch.Tensor, warmup: int, reps: int,
                method: str) -> VariantResult:
    from h3bench.harness.ops.norm_modulate import OP
    x, w, sh, sc, idx = (t[n] for n in ("x", "w", "sh", "sc", "idx"))
    leaves = [v.detach().requires_grad_() for v in (x, w, sh, sc)]
    with using_config(cfg):
        y = norm_modulate(*leaves, idx)
        y.backward(dy)
    ref = OP.reference(params, OP.bundle(t), (dy,), NAMES, OP.name)
    grad_err = {n: rel_err(leaf.grad, ref.grads[n]) for n, leaf in zip(NAMES, leaves)}
    fwd_err = rel_err(y, ref.outputs[0])
    digest = {n: _digest(v) for n, v in [("y", y)] + [(n, leaf.grad) for n, leaf in zip(NAMES, leaves)]}
    del ref, y

    plan = K.make_plan(idx, sh.shape[0]) if sh.shape[0] > cfg.local_max else None
    _, rstd = K.forward(x, w, sh, sc, idx, 1e-5, config=cfg, plan=plan)
    table_rows = sh.shape[0]

    def clear():
        for leaf in leaves:
            leaf.grad = None

    def fwd_bwd():
        norm_modulate(*leaves, idx, check_index=False).backward(dy)

    with using_config(cfg):
        return VariantResult(
            variant=name, config=dataclasses.asdict(cfg), fast_launch=common.ENABLED, fwd_err=fwd_err,
            grad_err=grad_err, digest=digest,
            fwd_us=_time(lambda: K.forward(x, w, sh, sc, idx, 1e-5, config=cfg, plan=plan), warmup, reps, method),
            bwd_dx_us=_time(lambda: K.backward(dy, x, w, sc, idx, rstd, table_rows, sh.dtype, False, cfg, plan),
                            warmup, reps, method),
            bwd_us=_time(lambda: K.backward(dy, x, w, sc, idx, rstd, table_rows, sh.dtype, True, cfg, plan),
                         warmup, reps, method),
            fwd_bwd_us=_time(fwd_bwd, warmup, reps, method, setup=clear),
        )


def _ints(text: str) -> list:
    return [int(v) for v in text.split(",") if v.strip()] or [None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=5376)
    parser.add_argument("--table-rows", type=int, default=9)
    parser.add_argument("--variants", default="default", help=f"presets: {', '.join(_variant_names())}")
    parser.add_argument("--fwd-warps", default="", help="override, e.g. 4,8 (empty: the preset's)")
    parser.add_argument("--bwd-warps", default="")
    parser.add_argument("--programs-per-sm", default="", help="backward programs per SM")
    parser.add_argument("--fast-launch", default="1,0", help="1: kernels/common.py fast path, 0: kernel[grid]")
    parser.add_argument("--method", default=SYNCHRONIZED, choices=("synchronized", "stream"))
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tools.bench_norm_modulate needs a CUDA GPU")
    from h3bench.harness.environment import measure_copy_bandwidth
    dev = torch.device("cuda")
    bandwidth, _ = measure_copy_bandwidth(dev)
    params, t = make_case(dev, args.hidden, args.rows, args.table_rows)
    from h3bench.harness.ops.norm_modulate import OP
    dy = OP.make_grad_outs(params, args.rows, 9, dev)[0]
    floor_fwd = OP.floor_bytes(params, args.rows, False) / (bandwidth * 1e3)
    floor_all = OP.floor_bytes(params, args.rows, True) / (bandwidth * 1e3)
    results = []
    print(f"copy bandwidth {bandwidth:.1f} GB/s; floor fwd {floor_fwd:.1f} us, fwd+bwd {floor_all:.1f} us")
    print(f"{'variant':>14} {'fw':>3} {'bw':>3} {'pps':>3} | {'fwd us':>15} {'fast':>4} {'bwd dx':>15} {'bwd':>15} "
          f"{'fwd+bwd':>15} | fwd% net% | fwd err, max grad err")
    for name, fw, bw, pps, fast in itertools.product(
            [v for v in args.variants.split(",") if v], _ints(args.fwd_warps), _ints(args.bwd_warps),
            _ints(args.programs_per_sm), _ints(args.fast_launch)):
        cfg = _variant(name, args.hidden)
        changes = {k: v for k, v in (("fwd_warps", fw), ("bwd_warps", bw), ("bwd_programs_per_sm", pps))
                   if v is not None}
        cfg = dataclasses.replace(cfg, **changes)
        common.ENABLED = bool(fast) if fast is not None else True
        try:
            r = run_variant(name, cfg, params, t, dy, args.warmup, args.reps, args.method)
        except Exception as exc:  # a variant that fails to compile is a line in the table
            print(f"{name:>14} {cfg.fwd_warps:>3} {cfg.bwd_warps:>3} {cfg.bwd_programs_per_sm:>3} | failed: "
                  f"{type(exc).__name__}: {str(exc)[-300:]}")
            continue
        results.append(r)
        print(f"{name:>14} {cfg.fwd_warps:>3} {cfg.bwd_warps:>3} {cfg.bwd_programs_per_sm:>3} | "
              f"{r.fwd_us[0]:>7.1f}/{r.fwd_us[1]:<7.1f} {int(r.fast_launch):>4} "
              f"{r.bwd_dx_us[0]:>7.1f}/{r.bwd_dx_us[1]:<7.1f} {r.bwd_us[0]:>7.1f}/{r.bwd_us[1]:<7.1f} "
              f"{r.fwd_bwd_us[0]:>7.1f}/{r.fwd_bwd_us[1]:<7.1f} | {floor_fwd / r.fwd_us[0]:.0%} "
              f"{floor_all / r.fwd_bwd_us[0]:.0%} | {r.fwd_err:.2e}, {max(r.grad_err.values()):.2e}", flush=True)
    common.ENABLED = True
    digests = {}
    for r in results:
        digests.setdefault(json.dumps(r.config, sort_keys=True), []).append(r.digest)
    for cfg, found in digests.items():
        print(f"fast and plain launch bitwise equal ({len(found)} runs of one config): "
              f"{all(d == found[0] for d in found)}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"bandwidth_gbps": bandwidth, "rows": args.rows, "hidden": args.hidden,
                       "table_rows": args.table_rows, "floor_fwd_us": floor_fwd, "floor_fwd_bwd_us": floor_all,
                       "gpu": torch.cuda.get_device_name(), "variants": [asdict(r) for r in results]}, handle,
                      indent=1)


if __name__ == "__main__":
    main()
