"""GPU check, timing and config choice for the batch-invariant GEMM ops (kernels/gemm.py): one call.

    python -m tools.bench_gemm --out gemm_bench.json          (an H200: ~3 minutes; --budget caps it)
    python -m tools.bench_gemm --dry-run --out /tmp/x.json   (CPU, under the interpreter: checks the script)

For timestep_mlp and adaln_projection at the model's size and T in (1, 3, 4, 8, 64, 256, 2048):
  1. errors against float64 (output and every gradient, max|err| / max|ref|), ours and cuBLAS's
     (the `diffusers` composition: F.linear, F.silu, F.linear / F.linear(F.silu(temb).to(bf16), W, b),
     TF32 off);
  2. forward (no_grad), backward (autograd.grad of a kept graph) and forward+backward, CUDA events,
     back-to-back (`stream`), median of --reps after --warmup, twice; the forward also synchronized
     (each sample from an idle GPU: host cost included, as the harness's `fwd_us`);
  3. the forward's weight-streaming bandwidth (the op's floor bytes / time, and its fraction of the
     measured copy bandwidth) at small T, and our time over cuBLAS's at T = 2048;
  4. batch invariance on the GPU: rows alone (T = 1), a 3-row and a 64-row slice against the same
     rows inside T = 2048, bitwise, outputs and per-row gradients (the fp32 op then runs different
     tile configs for the two: the check of kernels/gemm.py's proof);
  5. weight gradients twice at T = 2048, bitwise;
  6. candidate tile configs per kernel (each batch-invariant by itself: one config for every T),
     timed at the row counts they serve; fp32 candidates must give bitwise the default's output
     (the FMA-chain claim), bf16 candidates are checked one row alone against 2048.
Writes JSON to --out; prints a short table last. Every section catches its own errors (recorded
as strings), so one failing kernel does not lose the rest of the call.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--dry-run" in sys.argv:  # on before triton is first imported (below)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import asdict, replace  # noqa: E402
from typing import Callable  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from h3bench.harness.config import load_config  # noqa: E402
from h3bench.harness.environment import measure_copy_bandwidth  # noqa: E402
from h3bench.harness.execute import as_bits  # noqa: E402
from h3bench.harness.ops import get_op  # noqa: E402
from h3bench.harness.probes.accuracy_latency import rel_err  # noqa: E402
from h3bench.harness.timing import STREAM, SYNCHRONIZED, median, take  # noqa: E402
from h3bench.kernels import adaln_projection as AP  # noqa: E402
from h3bench.kernels.adaln_projection import DX_SPLIT  # noqa: E402
from h3bench.kernels import gemm  # noqa: E402
from h3bench.kernels import timestep_mlp as TM  # noqa: E402
from h3bench.kernels.gemm import LaunchConfig as C  # noqa: E402
from tools.kernel_times import summed_kernel_us  # noqa: E402

ROWS = (1, 3, 4, 8, 64, 256, 2048)
BIG = 2048
DEV = torch.device("cuda")
QUICK = False   # --dry-run: the CPU under the interpreter, the quick configs' widths (checks this script)
START = time.time()


def params_of(op_name: str):
    return load_config(op_name, quick=QUICK).inputs


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def elapsed() -> float:
    return time.time() - START


def tf32_off() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    except Exception:
        pass


def timed(fn: Callable[[], object], warmup: int, reps: int, repeats: int = 2, slow_ms: float = 5.0,
          synchronized: bool = False) -> dict:
    """Medians (us) of `repeats` blocks of `reps` back-to-back samples; a step slower than `slow_ms`
    gets a fifth of the reps (the call's time budget)."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    if (time.perf_counter() - t0) * 1e3 > slow_ms:
        warmup, reps = max(2, warmup // 5), max(10, reps // 5)
    for _ in range(warmup):
        fn()
    out = {"stream_us": [round(median(take(fn, DEV, STREAM, reps)), 2) for _ in range(repeats)], "reps": reps}
    if synchronized:
        out["sync_us"] = [round(median(take(fn, DEV, SYNCHRONIZED, reps)), 2) for _ in range(repeats)]
    return out


def best(t: dict) -> float:
    return min(t["stream_us"])


def guard(record: dict, key: str, fn: Callable[[], object]):
    try:
        record[key] = fn()
    except Exception as exc:  # recorded, never fatal: one GPU call has to bring back everything it can
        record[key] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    return record[key]


# --- the two ops --------------------------------------------------------------------------------------

def composition(op: str):
    if op == "timestep_mlp":
        def mlp(x, w1, b1, w2, b2):
            return F.linear(F.silu(F.linear(x, w1, b1)), w2, b2)
        return mlp

    def projection(temb, w, b):
        return F.linear(F.silu(temb).to(w.dtype), w, b)
    return projection


OURS = {"timestep_mlp": TM.timestep_mlp, "adaln_projection": AP.adaln_projection}


def leaves_of(inputs, names):
    return [inputs.tensors[n].detach().requires_grad_() for n in names]


def op_section(op_name: str, args, row_counts=None) -> dict:
    op = get_op(op_name)
    params = params_of(op_name)
    names = op.input_names
    result = {"rows": {}}
    for rows in row_counts or ROWS:
        rec: dict = {}
        result["rows"][str(rows)] = rec
        inputs = op.make_inputs(params, rows, 11, DEV)
        (dy,) = op.make_grad_outs(params, rows, 9, DEV)
        ref = op.reference(params, inputs, (dy,), names, op_name)
        for label, fn in (("ours", OURS[op_name]), ("cublas", composition(op_name))):
            def accuracy():
                leaves = leaves_of(inputs, names)
                out = fn(*leaves)
                grads = torch.autograd.grad(out, leaves, dy)
                return {"fwd": rel_err(out, ref.outputs[0]),
                        **{n: rel_err(g, ref.grads[n]) for n, g in zip(names, grads)}}
            guard(rec, f"{label}_err", accuracy)

            def timings():
                values = list(inputs.tensors.values())
                leaves = leaves_of(inputs, names)
                out = fn(*leaves)

                def fwd():
                    with torch.no_grad():
                        fn(*values)

                def bwd():
                    torch.autograd.grad(out, leaves, dy, retain_graph=True)

                def fwd_bwd():
                    torch.autograd.grad(fn(*leaves), leaves, dy)

                return {"fwd": timed(fwd, args.warmup, args.reps, synchronized=rows <= 8),
                        "bwd": timed(bwd, args.warmup, args.reps), "fwd_bwd": timed(fwd_bwd, args.warmup, args.reps)}
            guard(rec, f"{label}_us", timings)
        ours, cub = rec.get("ours_us", {}), rec.get("cublas_us", {})
        if "fwd" in ours:
            floor = op.floor_bytes(params, rows, backward=False)
            rec["fwd_floor_bytes"] = floor
            rec["fwd_gbps"] = round(floor / (best(ours["fwd"]) * 1e3), 1)
            rec["fwd_of_copy"] = round(rec["fwd_gbps"] / args.copy_gbps, 3)
            if "fwd" in cub:
                rec["ratio_to_cublas"] = {k: round(best(ours[k]) / best(cub[k]), 3) for k in ("fwd", "bwd", "fwd_bwd")
                                          if k in ours and k in cub}
        del inputs, ref, dy
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
    guard(result, "invariance", lambda: invariance(op_name, op, params, names))
    guard(result, "repeat", lambda: repeatability(op_name, op, params, names))
    return result


def invariance(op_name, op, params, names) -> dict:
    fn = OURS[op_name]
    full = op.make_inputs(params, BIG, 3, DEV)
    (dy,) = op.make_grad_outs(params, BIG, 5, DEV)
    leaves = leaves_of(full, names)
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dy)
    report = {}
    for lo, hi in ((0, 1), (1, 2), (BIG // 3, BIG // 3 + 1), (BIG - 1, BIG), (5, 8), (BIG // 32, BIG // 16)):
        sub = full.select_rows(torch.arange(lo, hi, device=DEV))
        sl = leaves_of(sub, names)
        so = fn(*sl)
        sg = torch.autograd.grad(so, sl, dy[lo:hi])
        report[f"{lo}:{hi}"] = {"out_equal": bool(torch.equal(as_bits(so), as_bits(out[lo:hi]))),
                                "rowgrad_equal": bool(torch.equal(as_bits(sg[0]), as_bits(grads[0][lo:hi])))}
    report["all_equal"] = all(v["out_equal"] and v["rowgrad_equal"] for v in report.values())
    return report


def repeatability(op_name, op, params, names) -> dict:
    fn = OURS[op_name]
    inputs = op.make_inputs(params, BIG, 3, DEV)
    (dy,) = op.make_grad_outs(params, BIG, 5, DEV)
    runs = []
    for _ in range(2):
        leaves = leaves_of(inputs, names)
        runs.append(torch.autograd.grad(fn(*leaves), leaves, dy))
    return {n: bool(torch.equal(as_bits(a), as_bits(b))) for n, a, b in zip(names, runs[0], runs[1])}


VARIANT_ROWS = (1, 8, 2048)


def variant_section(op_name: str, module, name: str, args) -> dict:
    """The whole op with another config set of its module (`TM.TF32X3_KM`, `AP.PERSISTENT`, ...) in place
    of the default: errors, timings against cuBLAS, invariance and repeatability, as `op_section`."""
    configs = getattr(module, name)
    module.use_configs(configs)
    try:
        result = op_section(op_name, args, tuple(min(r, BIG) for r in VARIANT_ROWS))
    finally:
        module.use_configs(module.DEFAULT)
    result["configs"] = repr(configs)
    return result


def db_blocks_section(args) -> dict:
    """timestep_mlp with the bias gradients as float64 column sums (`MLPConfigs.db_blocks`, the default's)
    against the dW GEMM's ones column: b1 / b2 errors and the backward's time, at T = 1 and the largest T."""
    import dataclasses

    op, params = get_op("timestep_mlp"), params_of("timestep_mlp")
    names = op.input_names
    result = {}
    try:
        for rows in (1, BIG):
            inputs = op.make_inputs(params, rows, 11, DEV)
            (dy,) = op.make_grad_outs(params, rows, 9, DEV)
            ref = op.reference(params, inputs, (dy,), names, "timestep_mlp")
            for flag in (False, True):
                # v5's configs: the ones column needs weight gradients outside fp16x3 (v6 takes column sums)
                TM.use_configs(dataclasses.replace(TM.TF32X3_V5, db_blocks=flag))
                leaves = leaves_of(inputs, names)
                out = TM.timestep_mlp(*leaves)
                grads = dict(zip(names, torch.autograd.grad(out, leaves, dy, retain_graph=True)))

                def bwd():
                    torch.autograd.grad(out, leaves, dy, retain_graph=True)
                result[f"T{rows}_{'blocks' if flag else 'column'}"] = {
                    "b1_err": rel_err(grads["b1"], ref.grads["b1"]), "b2_err": rel_err(grads["b2"], ref.grads["b2"]),
                    "bwd_us": timed(bwd, args.warmup, args.reps)}
                del out, grads, leaves
            del inputs, ref, dy
    finally:
        TM.use_configs(TM.DEFAULT)
    return result


# --- config candidates ---------------------------------------------------------------------------------

def c(bm: int, bn: int, bk: int, warps: int, stages: int, **more) -> C:
    return C(bm, bn, bk, num_warps=warps, num_stages=stages, **more)


def mlp_candidates():
    """(kernel, rows it serves, candidates); the first is the reference: the FMA tiers' config (TM.IEEE)
    for the FMA candidates, the default's for the tf32x3 ones. T = 2048 first: those carry the
    1.3x-of-cuBLAS target; small T after."""
    d = TM.IEEE
    k6 = TM.DX_SPLIT
    wt = {"transpose_w": True}
    found = [
        ("fwd1", 1, [gemm.pick(d.fwd1, 1), c(4, 64, 64, 2, 3), c(4, 16, 128, 1, 3)]),
        # GEMM1 in float64 (the default's precision) at small T: 84 programs of 32 x 64 took 9.1 us for 5.5 MB
        ("fwd1", 1, [gemm.pick(TM.DEFAULT.fwd1, 1), c(32, 32, 32, 4, 3, precision="fp64"),
                     c(16, 64, 32, 4, 3, precision="fp64"), c(32, 32, 64, 4, 2, precision="fp64"),
                     c(32, 64, 32, 8, 3, precision="fp64"), c(16, 32, 64, 4, 3, precision="fp64")]),
        ("fwd1", 2048, [gemm.pick(TM.DEFAULT.fwd1, 2048), c(32, 32, 32, 4, 3, precision="fp64"),
                        c(16, 64, 32, 4, 3, precision="fp64"), c(32, 32, 64, 4, 2, precision="fp64"),
                        c(32, 64, 32, 8, 3, precision="fp64"), c(16, 32, 64, 4, 3, precision="fp64")]),
        ("fwd2", 1, [gemm.pick(d.fwd2, 1), c(4, 8, 128, 1, 4), c(4, 32, 64, 1, 4), c(4, 16, 16, 1, 8),
                     c(2, 16, 128, 1, 5)]),
        ("fwd2", 8, [gemm.pick(d.fwd2, 8), c(8, 32, 64, 2, 4), c(8, 8, 128, 1, 4), c(8, 16, 32, 1, 6)]),
        ("fwd2", 2048, [gemm.pick(d.fwd2, 2048), c(128, 128, 16, 8, 3), c(128, 64, 16, 4, 3, **wt),
                        c(64, 128, 16, 4, 3, **wt), c(128, 128, 32, 8, 2, **wt), c(256, 128, 16, 8, 3, **wt)]),
        ("fwd2", 256, [gemm.pick(d.fwd2, 256), c(64, 64, 16, 4, 3), c(32, 64, 32, 4, 3, **wt)]),
        ("fwd1", 2048, [gemm.pick(d.fwd1, 2048), c(64, 128, 16, 4, 3), c(128, 128, 16, 8, 3, **wt)]),
        ("dh", 1, [gemm.pick(d.dh, 1), c(4, 16, 128, 1, 4), c(4, 64, 64, 2, 4)]),
        ("dh", 2048, [gemm.pick(d.dh, 2048), c(128, 64, 16, 4, 3), c(64, 128, 16, 4, 3), c(128, 128, 32, 8, 2)]),
        ("dx", 2048, [gemm.pick(d.dx, 2048), c(64, 128, 16, 4, 3, split_k=k6), c(32, 64, 32, 4, 3, split_k=k6),
                      c(128, 64, 16, 8, 3, split_k=k6)]),
        ("dw2", 1, [gemm.pick(d.dw2, 1), c(64, 64, 16, 4, 2), c(32, 128, 16, 4, 2)]),
        ("dw2", 2048, [gemm.pick(d.dw2, 2048), c(64, 128, 16, 4, 3), c(128, 64, 16, 4, 3), c(128, 128, 32, 8, 2)]),
        ("dw1", 2048, [gemm.pick(d.dw1, 2048), c(128, 64, 16, 8, 3), c(64, 128, 16, 4, 3), c(32, 64, 32, 4, 3)]),
    ]
    # tf32x3 tiles (tensor cores; not bitwise the FMA chains, by design) and fp64 ones (GEMM1: float64
    # products and sums): per-kernel times at T = 2048, each list headed by the default's config
    d = TM.DEFAULT
    t3 = {"precision": "tf32x3"}
    km = {"precision": "tf32x3", "k_major": True}
    f64 = {"precision": "fp64"}
    found += [
        ("fwd1", 2048, [gemm.pick(d.fwd1, 2048), c(128, 128, 32, 8, 3, **t3), c(128, 128, 64, 8, 2, **t3),
                        c(64, 128, 32, 4, 3, **t3), c(128, 256, 32, 8, 3, **t3), c(64, 256, 32, 8, 3, **t3),
                        c(64, 64, 32, 4, 3, **f64), c(32, 64, 32, 4, 3, **f64), c(64, 128, 32, 8, 3, **f64),
                        c(128, 64, 16, 8, 3, **f64), c(64, 64, 16, 4, 4, **f64), c(128, 128, 16, 8, 3, **f64),
                        c(64, 64, 32, 8, 3, **f64)]),
        ("fwd2", 2048, [gemm.pick(d.fwd2, 2048), c(128, 128, 32, 8, 3, persistent=True, **t3),
                        c(128, 128, 32, 8, 4, persistent=True, **t3), c(128, 256, 32, 8, 3, persistent=True, **t3),
                        c(128, 128, 64, 8, 2, persistent=True, **t3), c(128, 128, 32, 8, 3, split_k=4, **t3),
                        c(128, 128, 32, 8, 3, split_k=8, **t3), c(64, 128, 32, 4, 3, split_k=8, **t3)]),
        ("dh", 2048, [gemm.pick(d.dh, 2048), c(128, 128, 32, 8, 3, **km), c(128, 128, 32, 8, 4, persistent=True, **km),
                      c(128, 128, 32, 8, 3, split_k=2, **km), c(128, 128, 32, 8, 4, split_k=2, **km),
                      c(128, 128, 32, 8, 3, split_k=3, **km)]),
        ("dx", 2048, [gemm.pick(d.dx, 2048), c(128, 64, 32, 4, 3, split_k=k6, **km), c(128, 128, 32, 8, 3, split_k=k6, **km),
                      c(64, 128, 32, 4, 3, split_k=k6, **km), c(64, 64, 64, 4, 3, split_k=k6, **km),
                      c(64, 64, 32, 4, 4, split_k=k6, **km)]),
        ("dw2", 2048, [gemm.pick(d.dw2, 2048), c(128, 128, 32, 8, 3, **km), c(128, 128, 32, 8, 4, persistent=True, **km),
                       c(128, 128, 64, 8, 2, persistent=True, **km)]),
        # dW1 = dz1^T x is [5376, 256]: 168 tiles of 128 x 64 for 132 SMs; a split of T (weight gradients
        # may take one: their order is one per T anyway) or smaller tiles fill the machine
        ("dw1", 2048, [gemm.pick(d.dw1, 2048), c(128, 64, 32, 4, 3, **km), c(64, 64, 32, 4, 3, **t3),
                       c(64, 128, 32, 4, 3, **t3), c(128, 64, 32, 4, 3, split_k=2, **t3),
                       c(128, 64, 32, 4, 3, split_k=4, **t3), c(64, 64, 32, 4, 3, split_k=2, **t3),
                       c(128, 64, 32, 4, 3, split_k=3, **t3)]),
    ]
    # fp16x3 (three fp16 products per step, power-of-two scaled operands; tools/probe_fp16x3.py): the three
    # large GEMMs, K chunks and tiles, each list headed by the default's config
    h3 = {"precision": "fp16x3"}
    found += [
        ("fwd2", 2048, [gemm.pick(d.fwd2, 2048), c(128, 128, 64, 8, 3, **h3), c(128, 128, 64, 8, 4, **h3),
                        c(128, 128, 128, 8, 2, **h3), c(128, 128, 64, 8, 3, split_k=2, **h3),
                        c(128, 128, 64, 8, 3, split_k=4, **h3), c(128, 128, 64, 8, 3, split_k=8, **h3),
                        c(128, 128, 64, 8, 3, persistent=True, **h3), c(128, 64, 64, 4, 3, **h3)]),
        ("fwd2", 1, [gemm.pick(d.fwd2, 1), c(128, 128, 64, 8, 3, **h3), c(128, 128, 64, 8, 3, split_k=2, **h3),
                     c(128, 128, 64, 8, 3, split_k=4, **h3), c(128, 128, 64, 8, 3, split_k=8, **h3)]),
    ]
    # fp16x3 with each step's own scales (`local_scales`: no maxima pass over W2 first), at the T they
    # must serve: small T streams W2 (its tiles' MMA work and the programs' count decide), T = 2048 is
    # MMA-bound (the per-step maxima are extra CUDA-core work there)
    lh = {"precision": "fp16x3", "local_scales": True}
    # (session 14, call 2: the walked K chunks of 256 or 128 were slower at every T; 64-row tiles ~2.3x
    # slower at T = 2048.) Smaller stages and wider programs: more warps an SM to hide each step's
    # latency at small T
    # (call 3: 64 x 128 x 32 / 4 warps / 3 stages best at T = 1, 40.8 us of kernel, the v8 default; 255
    # registers and 126 programs at T <= 64: one program of 4 warps an SM.) Next: narrower tiles for two
    # programs an SM at small T, and more stages
    local = [c(128, 128, 64, 8, 3, split_k=6, **lh), c(64, 128, 32, 4, 3, split_k=6, **lh),
             c(64, 64, 32, 4, 3, split_k=6, **lh), c(64, 64, 32, 4, 4, split_k=6, **lh),
             c(64, 128, 32, 4, 4, split_k=6, **lh), c(64, 128, 16, 4, 4, split_k=6, **lh),
             c(64, 128, 32, 4, 3, split_k=7, **lh), c(64, 64, 64, 4, 3, split_k=6, **lh)]
    found += [
        ("fwd2", 2048, [gemm.pick(d.fwd2, 2048)] + local),
        ("fwd2", 8, [gemm.pick(d.fwd2, 8)] + local),
        ("fwd2", 1, [gemm.pick(d.fwd2, 1)] + local),
        ("dh", 2048, [gemm.pick(d.dh, 2048), c(128, 128, 64, 8, 3, **h3), c(128, 128, 64, 8, 3, split_k=2, **h3),
                      c(128, 128, 64, 8, 4, **h3), c(128, 128, 64, 8, 3, persistent=True, **h3)]),
        ("dw2", 2048, [gemm.pick(d.dw2, 2048), c(128, 128, 64, 8, 3, **h3), c(128, 128, 64, 8, 4, **h3),
                       c(128, 128, 64, 8, 3, persistent=True, **h3), c(128, 128, 64, 8, 3, split_k=2, **h3)]),
        # the two small ones (N = 256): dx over K = 5376 in DX_SPLIT chunks, dW1 over T
        ("dx", 2048, [gemm.pick(d.dx, 2048), c(64, 64, 64, 4, 3, split_k=k6, **h3), c(128, 64, 64, 4, 3, split_k=k6, **h3),
                      c(128, 128, 64, 8, 3, split_k=k6, **h3)]),
        ("dw1", 2048, [gemm.pick(d.dw1, 2048), c(128, 64, 64, 4, 3, **h3), c(128, 128, 64, 8, 3, **h3),
                       c(64, 64, 64, 4, 3, **h3), c(128, 64, 64, 4, 3, split_k=2, **h3)]),
    ]
    # a candidate equal to its list's reference (the defaults moved since the lists were written) is timed once
    found = [(kernel, rows, [cands[0]] + [x for x in cands[1:] if x != cands[0]]) for kernel, rows, cands in found]
    return sorted(found, key=lambda item: -item[1])


def ada_candidates():
    """(kernel, candidates): each one config for every T (its split included); the first is the default.
    The tma candidates (kernels/notes/gemm.md v15) read A and B through TMA descriptors: with the default's
    tiles and K chunks they must give its bits (`bitwise_equal_default`); the others show whether a
    16-bit tile's shape changes a sum (one config for every T either way)."""
    d = AP.POINTER.at(1)
    tma = dict(tma=True)
    # the K loop warp-specialized (kernels/notes/gemm.md v17): a TMA producer group and two consumer groups of 64
    # rows, 12 warps from num_warps 4; 3 stages (4 would not fit 128 x 256 tiles' shared memory beside the
    # producer's barriers), the pointer set's tiles, steps and chunks: its bits are the question
    ws = dict(tma=True, num_warps=4, warp_specialize=True)
    # the backward's GEMMs first (where the gap to cuBLAS is); within a list the default's own tiles first
    return [
        # block_k 128: the same k16 wgmma slices in the same order, half the waits a k (bits checked)
        ("dw", [d.dw, replace(d.dw, persistent=True, **tma), replace(d.dw, persistent=True, tma_store=True, **tma),
                replace(d.dw, persistent=True, num_stages=3, **tma),
                replace(d.dw, persistent=True, num_stages=3, tma_store=True, **tma),
                replace(d.dw, block_k=128, num_stages=2, persistent=True, **tma), replace(d.dw, **tma),
                replace(d.dw, persistent=True, group_m=16, **tma), c(256, 128, 64, 8, 3, persistent=True, **tma),
                replace(d.dw, persistent=True, num_stages=3, **ws), replace(d.dw, num_stages=3, **ws)]),
        ("dx", [d.dx, replace(d.dx, **tma), replace(d.dx, persistent=True, **tma),
                replace(d.dx, persistent=True, num_stages=3, **tma),
                replace(d.dx, block_k=128, num_stages=3, persistent=True, **tma),
                c(128, 256, 64, 8, 3, split_k=DX_SPLIT, **tma),
                c(128, 256, 64, 8, 3, split_k=DX_SPLIT, persistent=True, **tma),
                # 3 chunks (another order): 16 x 11 x 3 = 528 items of 128 x 256 at T = 2048, 4 an SM exactly
                c(128, 256, 64, 8, 3, split_k=3, persistent=True, **tma),
                c(128, 128, 64, 8, 4, split_k=3, persistent=True, **tma),
                # the default's chunks on 256 x 128 tiles: half the programs, each W tile read by 8 row
                # tiles instead of 16 (sm_90, triton 3.6: 255 registers, no spill, 147 KB of smem)
                c(256, 128, 64, 8, 3, split_k=DX_SPLIT, **tma),
                c(256, 128, 64, 8, 3, split_k=DX_SPLIT, persistent=True, **tma),
                replace(d.dx, persistent=True, **ws), replace(d.dx, persistent=True, num_stages=3, **ws)]),
        ("fwd", [d.fwd, replace(d.fwd, **tma), replace(d.fwd, tma_store=True, **tma),
                 replace(d.fwd, num_stages=3, **tma), replace(d.fwd, num_stages=3, tma_store=True, **tma),
                 replace(d.fwd, block_k=128, num_stages=2, **tma),
                 replace(d.fwd, persistent=False, **tma), replace(d.fwd, group_m=8, **tma),
                 replace(d.fwd, num_stages=3, **ws), replace(d.fwd, persistent=False, num_stages=3, **ws)]),
    ]


def mlp_kernel_call(kernel: str, rows: int, cfg: C, t: dict) -> Callable[[], torch.Tensor]:
    x, w1, b1, w2, b2, h, z, dy = (t[k] for k in ("x", "w1", "b1", "w2", "b2", "h", "z", "dy"))
    return {
        "fwd1": lambda: gemm.forward(x, w1, b1, cfg, out_dtype=torch.float32, out_silu=True, save_pre=True)[0],
        "fwd2": lambda: gemm.forward(h, w2, b2, cfg, out_dtype=torch.float32)[0],
        "dh": lambda: gemm.input_grad(dy, w2, cfg, dsilu_of=z),
        "dx": lambda: gemm.input_grad(z, w1, cfg),
        # fp16x3 takes db as column sums (its own launch, as in the op)
        "dw2": lambda: gemm.weight_grad(dy, h, cfg, dw_dtype=torch.float32, db_dtype=torch.float32,
                                        db_blocks=cfg.precision == gemm.SCALED)[0],
        "dw1": lambda: gemm.weight_grad(z, x, cfg, dw_dtype=torch.float32, db_dtype=torch.float32,
                                        db_blocks=cfg.precision == gemm.SCALED)[0],
    }[kernel]


def mlp_kernel_reference(kernel: str, t: dict) -> torch.Tensor:
    """The float64 value of `mlp_kernel_call(kernel, ...)`'s output."""
    x, w1, b1, w2, b2, h, z, dy = (t[k].double() for k in ("x", "w1", "b1", "w2", "b2", "h", "z", "dy"))
    s = torch.sigmoid(z)
    return {"fwd1": lambda: F.silu(x @ w1.t() + b1), "fwd2": lambda: h @ w2.t() + b2,
            "dh": lambda: (dy @ w2) * (s * (1 + z * (1 - s))), "dx": lambda: z @ w1,
            "dw2": lambda: dy.t() @ h, "dw1": lambda: z.t() @ x}[kernel]()


def mlp_tensors(rows: int) -> dict:
    op = get_op("timestep_mlp")
    params = params_of("timestep_mlp")
    t = dict(op.make_inputs(params, rows, 11, DEV).tensors)
    g = torch.Generator(device=DEV).manual_seed(7)
    t["h"] = torch.randn(rows, params.hidden, generator=g, device=DEV)
    t["z"] = torch.randn(rows, params.hidden, generator=g, device=DEV)
    t["dy"] = torch.randn(rows, params.temb_dim, generator=g, device=DEV)
    return t


def mlp_configs(args) -> list:
    out = []
    cache = {}
    wanted = set(filter(None, args.mlp_precisions.split(",")))
    for kernel, rows, cands in mlp_candidates():
        if wanted and not any(cfg.precision in wanted for cfg in cands):
            continue
        if args.mlp_kernels and kernel not in args.mlp_kernels.split(","):
            continue
        rows = min(rows, BIG)
        if rows not in cache:
            cache[rows] = mlp_tensors(rows)
        t = cache[rows]
        reference = None
        exact = mlp_kernel_reference(kernel, t)
        for i, cfg in enumerate(cands):
            rec = {"kernel": kernel, "rows": rows, "config": cfg.short(), "default": i == 0, **asdict(cfg)}
            out.append(rec)
            if elapsed() > args.budget:
                rec["skipped"] = "time budget"
                continue
            try:
                call = mlp_kernel_call(kernel, rows, cfg, t)
                y = call()
                if reference is None:
                    reference = y.clone()
                if cfg.precision == cands[0].precision == "ieee":  # the FMA-chain claim; tf32x3 has none
                    rec["bitwise_equal_default"] = bool(torch.equal(as_bits(y), as_bits(reference)))
                rec["err"] = rel_err(y, exact)
                rec["us"] = timed(call, args.warmup, args.reps)
                if rows <= 64 and DEV.type == "cuda":   # small T: the host paces the stream; the kernels' own time
                    rec["kernel_us"] = summed_kernel_us(call, args.reps)
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    return out


def ada_configs(args) -> list:
    op = get_op("adaln_projection")
    params = params_of("adaln_projection")
    p = op.parameters(params, DEV)
    w, b = p["w"], p["b"]
    g = torch.Generator(device=DEV).manual_seed(7)
    data = {}
    timed_rows = sorted({min(r, BIG) for r in args.ada_rows} | {BIG})
    for rows in timed_rows:
        temb = torch.randn(rows, params.temb_dim, generator=g, device=DEV)
        dy = torch.randn(rows, params.out_features, generator=g, device=DEV).to(torch.bfloat16)
        a = gemm.silu_cast(temb, torch.bfloat16, ones_column=True)
        data[rows] = (temb, dy, a)
    out = []
    for kernel, cands in ada_candidates():
        if args.ada_same_tiles:   # the candidates a tier of the default may take (kernels/adaln_projection.py)
            cands = [cand for cand in cands if cand != "fused" and AP._order(cand) == AP._order(cands[0])]
        if args.ada_match:   # the default (the bitwise reference) and the candidates whose label has the text
            cands = cands[:1] + [cand for cand in cands[1:] if cand != "fused" and args.ada_match in cand.short()]
        reference = None   # the default's output at T = BIG, for the bitwise check of the others
        for i, cand in enumerate(cands):
            fused = cand == "fused"
            cfg = AP.POINTER.at(1).fwd if fused else cand
            label = cfg.short() + (f"/g{cfg.group_m}" if cfg.group_m != 8 else "")   # short() leaves the group out
            rec = {"kernel": kernel, "config": ("fused silu, " if fused else "") + label, "default": i == 0,
                   **asdict(cfg)}
            out.append(rec)
            if elapsed() > args.budget:
                rec["skipped"] = "time budget"
                continue
            try:
                def call_for(rows):
                    temb, dy, a = data[rows]
                    if kernel == "fwd":
                        if fused:
                            return lambda: gemm.forward(temb, w, b, cfg, out_dtype=torch.bfloat16, a_silu=True)[0]
                        return lambda: gemm.forward(a, w, b, cfg, out_dtype=torch.bfloat16)[0]
                    if kernel == "dx":
                        return lambda: gemm.input_grad(dy, w, cfg, dsilu_of=temb)
                    return lambda: gemm.weight_grad(dy, a, cfg, a_ones="stored", dw_dtype=torch.bfloat16,
                                                    db_dtype=torch.bfloat16)
                if kernel in ("fwd", "dx"):  # the config is batch-invariant by itself: row 0 alone vs in 2048
                    temb, dy, a = data[BIG]
                    big = call_for(BIG)()
                    one = {"fwd": lambda: (gemm.forward(temb[:1], w, b, cfg, out_dtype=torch.bfloat16, a_silu=True)[0]
                                           if fused else gemm.forward(a[:1], w, b, cfg, out_dtype=torch.bfloat16)[0]),
                           "dx": lambda: gemm.input_grad(dy[:1], w, cfg, dsilu_of=temb[:1])}[kernel]()
                    rec["row_alone_equal"] = bool(torch.equal(as_bits(one[0]), as_bits(big[0])))
                    del big
                outputs = call_for(BIG)()
                outputs = outputs if isinstance(outputs, tuple) else (outputs,)
                if i == 0:
                    reference = outputs
                elif reference is not None:
                    rec["bitwise_equal_default"] = all(torch.equal(as_bits(x), as_bits(y))
                                                       for x, y in zip(outputs, reference))
                del outputs
                rec["us"] = {str(rows): timed(call_for(rows), args.warmup, args.reps) for rows in timed_rows}
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            if DEV.type == "cuda":
                torch.cuda.empty_cache()
    return out


# --- report --------------------------------------------------------------------------------------------

def table(report: dict) -> str:
    lines = []
    sections = [(op_name, report[op_name]) for op_name in ("timestep_mlp", "adaln_projection") if op_name in report]
    sections += list(report.get("variants", {}).items())
    for op_name, sec in sections:
        if not isinstance(sec, dict):
            lines.append(f"== {op_name}: {sec}")
            continue
        lines.append(f"== {op_name} (copy {report['copy_gbps']:.0f} GB/s)")
        lines.append(f"{'T':>5} {'fwd us':>9} {'cublas':>9} {'bwd us':>9} {'cublas':>9} {'f+b us':>9} {'cublas':>9} "
                     f"{'f+b x':>6} {'fwd GB/s':>9} {'of copy':>7} {'max err ours/cublas':>22}")
        for rows, rec in sec.get("rows", {}).items():
            o, c = rec.get("ours_us", {}), rec.get("cublas_us", {})

            def v(t, k):
                return f"{best(t[k]):9.1f}" if isinstance(t, dict) and k in t else f"{'-':>9}"
            oe, ce = rec.get("ours_err", {}), rec.get("cublas_err", {})
            me = (max(oe.values()) if oe and "error" not in oe else math.nan,
                  max(ce.values()) if ce and "error" not in ce else math.nan)
            ratio = rec.get("ratio_to_cublas", {}).get("fwd_bwd", math.nan)
            lines.append(f"{rows:>5} {v(o, 'fwd')} {v(c, 'fwd')} {v(o, 'bwd')} {v(c, 'bwd')} {v(o, 'fwd_bwd')} "
                         f"{v(c, 'fwd_bwd')} {ratio:6.2f} {rec.get('fwd_gbps', math.nan):9.0f} "
                         f"{rec.get('fwd_of_copy', math.nan):7.2f} {me[0]:10.2e}/{me[1]:.2e}")
            if "error" in o or "error" in oe:
                lines.append(f"      ERROR: {o.get('error') or oe.get('error')}")
        inv = sec.get("invariance", {})
        lines.append(f"   invariance (rows alone / slices vs T=2048, bitwise): {inv.get('all_equal', inv)}")
        lines.append(f"   weight grads repeat: {sec.get('repeat')}")
    blocks = report.get("db_blocks", {})
    lines.append("== timestep_mlp bias gradients: ones column against float64 column sums (the default)")
    for key, rec in blocks.items():
        if isinstance(rec, dict) and "b1_err" in rec:
            lines.append(f"   {key:>16}: b1 {rec['b1_err']:.2e}  b2 {rec['b2_err']:.2e}  bwd {best(rec['bwd_us']):.1f} us")
        else:
            lines.append(f"   {key}: {rec}")
    lines.append("== config candidates (best stream us; * = each list's reference, `default` in the JSON: "
                 "the default's config, or the FMA tiers' for the FMA lists)")
    records = []
    for op_name in ("timestep_mlp", "adaln_projection"):
        found = report.get("configs", {}).get(op_name, [])
        if isinstance(found, dict):   # the whole list failed: `guard` kept its error
            lines.append(f"   {op_name}: ERROR {found.get('error')}")
        else:
            records += found
    for rec in records:
        mark = "*" if rec.get("default") else " "
        if "us" in rec:
            us = rec["us"]
            t = (" ".join(f"T{r}:{best(x):.1f}" for r, x in us.items()) if "stream_us" not in us
                 else f"T{rec.get('rows')}:{best(us):.1f}")
            if "kernel_us" in rec:
                t += f" (kernels {rec['kernel_us']:.1f})"
        else:
            t = rec.get("error") or rec.get("skipped", "")
        check = " ".join(f"{name} {rec[key]}" for key, name in (("row_alone_equal", "alone"),
                                                                 ("bitwise_equal_default", "=default")) if key in rec)
        err = f"err {rec['err']:.2e}" if "err" in rec else ""
        lines.append(f" {mark} {rec['kernel']:5s} {rec['config']:32s} {t}  {err}  {check}")
    lines.append(f"total {elapsed():.0f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--budget", type=float, default=200.0, help="seconds after which config candidates are skipped")
    parser.add_argument("--skip-configs", action="store_true")
    parser.add_argument("--skip-ops", action="store_true", help="skip the default configs' op sections and db_blocks")
    parser.add_argument("--mlp-variants", default="DEFAULT,TF32X3_V5",
                        help="config sets of kernels/timestep_mlp.py run as the whole op (comma-separated names)")
    parser.add_argument("--ada-variants", default="DEFAULT",
                        help="config sets of kernels/adaln_projection.py run as the whole op")
    parser.add_argument("--mlp-precisions", default="",
                        help="only the timestep_mlp candidate lists holding a config of these precisions (e.g. fp16x3)")
    parser.add_argument("--mlp-kernels", default="",
                        help="only the timestep_mlp candidate lists of these kernels (e.g. fwd2; default: all)")
    parser.add_argument("--configs-of", default="adaln_projection,timestep_mlp",
                        help="whose candidate lists to time")
    parser.add_argument("--ada-rows", default="1,8",
                        help="T at which adaln_projection's candidates are timed (and the largest T, always)")
    parser.add_argument("--ada-same-tiles", action="store_true",
                        help="only adaln_projection's candidates with the pointer set's tiles, steps and chunks "
                             "(what a tier of its default may differ in: the T switch's crossover)")
    parser.add_argument("--ada-match", default="",
                        help="only adaln_projection's candidates whose label (LaunchConfig.short()) holds this text, "
                             "e.g. /WS, beside each list's default")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, TRITON_INTERPRET=1 and the quick widths: checks this script, measures nothing")
    args = parser.parse_args()
    args.ada_rows = [int(r) for r in args.ada_rows.split(",") if r]
    global DEV, QUICK, BIG, ROWS
    if args.dry_run:
        DEV, QUICK, BIG, ROWS = torch.device("cpu"), True, 40, (1, 3, 40)
        args.warmup, args.reps = 1, 2
    tf32_off()
    torch.manual_seed(0)
    report: dict = {"device": torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu (dry run)",
                    "torch": torch.__version__}
    import triton
    report["triton"] = triton.__version__
    args.copy_gbps = measure_copy_bandwidth(DEV)[0]
    report["copy_gbps"] = round(args.copy_gbps, 1)
    report["defaults"] = {"timestep_mlp": repr(TM.DEFAULT), "adaln_projection": repr(AP.DEFAULT)}
    for op_name in () if args.skip_ops else ("timestep_mlp", "adaln_projection"):
        guard(report, op_name, lambda: op_section(op_name, args))
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
    if not args.skip_ops:
        guard(report, "db_blocks", lambda: db_blocks_section(args))
    report["variants"] = {}
    for op_name, module, names in (("timestep_mlp", TM, args.mlp_variants), ("adaln_projection", AP, args.ada_variants)):
        for name in filter(None, names.split(",")):
            guard(report["variants"], f"{op_name}:{name}", lambda: variant_section(op_name, module, name, args))
            if DEV.type == "cuda":
                torch.cuda.empty_cache()
    report["configs"] = {}
    if not args.skip_configs:  # the bf16 op first: its three kernels carry most of the T = 2048 time
        if "adaln_projection" in args.configs_of:
            guard(report["configs"], "adaln_projection", lambda: ada_configs(args))
        if "timestep_mlp" in args.configs_of:
            guard(report["configs"], "timestep_mlp", lambda: mlp_configs(args))
    report["seconds"] = round(elapsed(), 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(table(report))


if __name__ == "__main__":
    main()
