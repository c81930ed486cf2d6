"""Feasibility probe: fp32 GEMMs as three fp16 tensor-core products ("fp16x3") against tf32x3 (GPU).

    python -m tools.probe_fp16x3 --out DIR            (an H200: ~2 minutes)
    TRITON_INTERPRET=1 python -m tools.probe_fp16x3 --dry-run --out /tmp/x   (CPU: checks the script)

Why: timestep_mlp's three large GEMMs (T = 2048, 5376 x 5376) run in tf32x3 near that format's ceiling
(3 tf32 wgmma per k8 slice; H200 dense tf32 ~495 TFLOP/s), and the batch-invariant TF32 modes beat the
op by ~6% (issue 11). fp16 wgmma runs at twice tf32's rate with the same 11-bit significand, so
hi = fp16(v), lo = fp16(v - hi) and hi*hi + hi*lo + lo*hi would be tf32x3's arithmetic at half the
MMA time, if fp16's exponent range can be made to fit: each operand is scaled by a power of two
(exact) so its largest magnitude lands in [2^13, 2^14) — per row for an activation (a function of the
row alone: batch-invariant), per row of W — and the accumulator is scaled back (exact again).

This probe answers, before any of it enters kernels/: how fast is such a GEMM at the three shapes
(fwd2: h W2^T; dh: dy W2; dW2: dy^T h), split in registers from fp32 tiles ("inreg") or read from
pre-split fp16 copies ("pre"), against the default tf32x3 kernels and cuBLAS (fp32, TF32, fp16 one
pass: the last is the fp16 speed of light), and how large are the errors against float64.
Writes probe_fp16x3.json to --out.
"""
from __future__ import annotations

import argparse
import json
import time
import traceback

import torch
import triton
import triton.language as tl

from h3bench.harness.timing import STREAM, median, take
from h3bench.kernels import gemm
from h3bench.kernels import timestep_mlp as TM
from h3bench.kernels.gemm import _pow2_scale


@triton.jit
def _row_scale_kernel(X, S, n_cols, stride_r, stride_c, BLOCK: tl.constexpr):
    """S[r] = the power of two that takes max_c |X[r, c]| into [2^13, 2^14) (kernels/gemm.py's
    `_pow2_scale`: the scale the kernels use)."""
    r = tl.program_id(0)
    m = tl.zeros((BLOCK,), tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        x = tl.load(X + r.to(tl.int64) * stride_r + c.to(tl.int64) * stride_c, mask=c < n_cols, other=0.0)
        m = tl.maximum(m, tl.abs(x))
    tl.store(S + r, _pow2_scale(tl.max(m, 0)))


def row_scales(x: torch.Tensor, by_columns: bool = False) -> torch.Tensor:
    """Power-of-two scale per row of x [R, C] (per column with `by_columns`)."""
    rows, cols = (x.shape[1], x.shape[0]) if by_columns else x.shape
    sr, sc = (x.stride(1), x.stride(0)) if by_columns else (x.stride(0), x.stride(1))
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    _row_scale_kernel[(rows,)](x, out, cols, sr, sc, BLOCK=1024 if x.is_cuda else 64)
    return out


@triton.jit
def _split_kernel(X, S, HI, LO, n_cols, stride_r, BLOCK: tl.constexpr, BY_COLUMNS: tl.constexpr):
    """hi = fp16(x s), lo = fp16(x s - hi), s per row (or per column: BY_COLUMNS)."""
    r = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < n_cols
    x = tl.load(X + r.to(tl.int64) * stride_r + c, mask=ok, other=0.0)
    if BY_COLUMNS:
        x = x * tl.load(S + c, mask=ok, other=1.0)
    else:
        x = x * tl.load(S + r)
    hi = x.to(tl.float16)
    lo = (x - hi.to(tl.float32)).to(tl.float16)
    tl.store(HI + r.to(tl.int64) * n_cols + c, hi, mask=ok)
    tl.store(LO + r.to(tl.int64) * n_cols + c, lo, mask=ok)


def split(x: torch.Tensor, scales: torch.Tensor, by_columns: bool = False):
    rows, cols = x.shape
    hi = torch.empty((rows, cols), dtype=torch.float16, device=x.device)
    lo = torch.empty_like(hi)
    _split_kernel[(rows, triton.cdiv(cols, 1024))](x, scales, hi, lo, cols, x.stride(0), BLOCK=1024,
                                                  BY_COLUMNS=by_columns)
    return hi, lo


@triton.jit
def _fp16x3_kernel(A, B, AL, BL, C, SA, SB, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                   stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, PRE: tl.constexpr, SUM: tl.constexpr):
    """C = A' B' in fp16x3. A' [M, K] rows scaled by SA[m], B' [K, N] columns by SB[n]. PRE: A and B are
    the fp16 hi parts and AL, BL the lo parts (already scaled); else A, B are fp32 and split here.
    SUM: "mma" (every product into the one accumulator the tensor core carries), "step" (each BLOCK_K
    step's three products into a fresh tensor-core accumulator, added to the fp32 total on the CUDA
    cores: the FP8 recipe's promotion), "split" (as step, the small terms and hi*hi in two fresh
    accumulators), "tf32x3" (control: the same kernel on fp32 operands with Triton's tf32x3 dot)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    group = tl.minimum(num_m - first_m, GROUP_M)
    rm = (first_m + (pid % width) % group) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = ((pid % width) // group) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    row_ok = rm < M
    col_ok = rn < N
    a_off = rm.to(tl.int64)[:, None] * stride_am + rk[None, :].to(tl.int64) * stride_ak
    b_off = rk.to(tl.int64)[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
    sa = tl.load(SA + rm, mask=row_ok, other=1.0)
    sb = tl.load(SB + rn, mask=col_ok, other=1.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if PRE:
            a_hi = tl.load(A + a_off, mask=row_ok[:, None], other=0.0)
            a_lo = tl.load(AL + a_off, mask=row_ok[:, None], other=0.0)
            b_hi = tl.load(B + b_off, mask=col_ok[None, :], other=0.0)
            b_lo = tl.load(BL + b_off, mask=col_ok[None, :], other=0.0)
        else:
            a = tl.load(A + a_off, mask=row_ok[:, None], other=0.0) * sa[:, None]
            b = tl.load(B + b_off, mask=col_ok[None, :], other=0.0) * sb[None, :]
            if SUM != "tf32x3":
                a_hi = a.to(tl.float16)
                a_lo = (a - a_hi.to(tl.float32)).to(tl.float16)
                b_hi = b.to(tl.float16)
                b_lo = (b - b_hi.to(tl.float32)).to(tl.float16)
        if SUM == "mma":
            acc = tl.dot(a_lo, b_hi, acc)   # the small terms first
            acc = tl.dot(a_hi, b_lo, acc)
            acc = tl.dot(a_hi, b_hi, acc)
        elif SUM == "step":
            part = tl.dot(a_lo, b_hi)
            part = tl.dot(a_hi, b_lo, part)
            part = tl.dot(a_hi, b_hi, part)
            acc += part
        elif SUM == "split":
            small = tl.dot(a_lo, b_hi)
            small = tl.dot(a_hi, b_lo, small)
            acc += small
            acc += tl.dot(a_hi, b_hi)
        else:
            acc = tl.dot(a, b, acc, input_precision="tf32x3")
        a_off += BLOCK_K * stride_ak
        b_off += BLOCK_K * stride_bk
    acc = acc * (1.0 / sa)[:, None]   # powers of two: exact
    acc = acc * (1.0 / sb)[None, :]
    tl.store(C + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask=row_ok[:, None] & col_ok[None, :])


def fp16x3(a, a_strides, b, b_strides, sa, sb, M, N, K, cfg, pre=None, how="mma"):
    """C[M, N] = A'[M, K] B'[K, N] (views by strides); `pre` = (a_hi, a_lo, b_hi, b_lo) with the same
    strides, or None (split in registers). K must be a multiple of cfg's block_k (the probe's shapes)."""
    bm, bn, bk, warps, stages = cfg
    if K % bk:
        raise ValueError(f"K = {K} not a multiple of {bk}")
    c = torch.empty((M, N), dtype=torch.float32, device=a.device)
    args = (pre[0], pre[2], pre[1], pre[3]) if pre else (a, b, a, b)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _fp16x3_kernel[grid](*args, c, sa, sb, M, N, K, *a_strides, *b_strides, c.stride(0), c.stride(1),
                         BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, PRE=pre is not None, SUM=how,
                         num_warps=warps, num_stages=stages)
    return c


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).abs().max() / ref.abs().max())


def timed_us(fn, dev, reps: int) -> list[float]:
    fn()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    for _ in range(3):
        fn()
    return [round(median(take(fn, dev, STREAM, reps)), 1) for _ in range(2)]


CONFIGS = [(128, 256, 32, 8, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 2)]
# (where the operands come from, how the products are summed); call 1 (da3cf34) timed pre/mma and
# inreg/mma: 2.2e-5 of error against tf32x3's 2.4e-7 at the same speed ratio as below
WAYS = [("pre", "mma"), ("pre", "step"), ("pre", "split"), ("inreg", "step"), ("inreg", "tf32x3")]


def shapes(dev, t: int, d: int, d_out: int):
    """The three GEMMs of timestep_mlp's large half (hidden d, out d_out): name -> (A', strides, B',
    strides, M, N, K)."""
    g = torch.Generator(device=dev).manual_seed(3)
    h = torch.nn.functional.silu(torch.randn(t, d, generator=g, device=dev))
    w2 = torch.randn(d_out, d, generator=g, device=dev) * d ** -0.5
    dy = torch.randn(t, d_out, generator=g, device=dev)
    return {
        # fwd2: out = h W2^T: A' = h [T, d], B' = W2^T (B'[k, n] = W2[n, k])
        "fwd2": (h, (h.stride(0), h.stride(1)), w2, (w2.stride(1), w2.stride(0)), t, d_out, d),
        # dh: dy W2: A' = dy [T, d_out], B' = W2 [d_out, d] as it is
        "dh": (dy, (dy.stride(0), dy.stride(1)), w2, (w2.stride(0), w2.stride(1)), t, d, d_out),
        # dW2 = dy^T h: A' = dy^T [d_out, T], B' = h [T, d]
        "dw2": (dy, (dy.stride(1), dy.stride(0)), h, (h.stride(0), h.stride(1)), d_out, d, t),
    }


def scales_for(name, a, b):
    """Power-of-two scales, each a function of what batch invariance allows: per row of an activation
    A' (fwd2, dh), per row of W (fwd2's B' columns); per tensor where the scaled axis is the batch (dW2)
    or a column of W (dh), as one value broadcast."""
    if name == "fwd2":
        return row_scales(a), row_scales(b)
    if name == "dh":
        sb = row_scales(b).min()
        return row_scales(a), sb.expand(b.shape[1]).contiguous()
    sa = row_scales(a).min().expand(a.shape[1]).contiguous()   # dy^T's rows are dy's columns
    sb = row_scales(b).min().expand(b.shape[1]).contiguous()
    return sa, sb


def probe(dev, t: int, d: int, d_out: int, reps: int, configs, budget: float) -> dict:
    out: dict = {}
    for name, (a, a_st, b, b_st, M, N, K) in shapes(dev, t, d, d_out).items():
        rec = out[name] = {}
        shape_start = time.time()   # each of the three shapes gets a third of the budget
        av = torch.as_strided(a, (M, K), a_st)
        bv = torch.as_strided(b, (K, N), b_st)
        ref = av.double() @ bv.double()
        sa, sb = scales_for(name, a, b)
        rec["scales_us"] = timed_us(lambda: scales_for(name, a, b), dev, reps)
        # pre-split copies laid out as A' and B' are read (row-major [M, K] and [K, N])
        a_hi, a_lo = split(av.contiguous(), sa)
        b_hi, b_lo = split(bv.contiguous(), sb, by_columns=True)
        rec["split_us"] = timed_us(lambda: (split(av.contiguous(), sa), split(bv.contiguous(), sb, True)), dev,
                                   reps)
        pre = (a_hi, a_lo, b_hi, b_lo)
        pre_st = ((K, 1), (N, 1))
        for cfg in configs:
            if time.time() - shape_start > budget / 3:
                rec["skipped"] = "budget"
                break
            for way, how in WAYS:
                key = f"{way}/{how} {'x'.join(map(str, cfg[:3]))}/w{cfg[3]}/s{cfg[4]}"
                try:
                    if way == "pre":
                        fn = lambda cfg=cfg, how=how: fp16x3(a_hi, pre_st[0], b_hi, pre_st[1], sa, sb, M, N, K, cfg,
                                                             pre, how)
                    else:
                        fn = lambda cfg=cfg, how=how: fp16x3(a, a_st, b, b_st, sa, sb, M, N, K, cfg, None, how)
                    rec[key] = {"err": rel(fn(), ref), "us": timed_us(fn, dev, reps)}
                except Exception as exc:
                    rec[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        # the default tf32x3 kernel of this GEMM, and cuBLAS
        cfgs = TM.configs()
        tens = {"fwd2": lambda: gemm.forward(a, b, None, gemm.pick(cfgs.fwd2, t), out_dtype=torch.float32)[0],
                "dh": lambda: gemm.input_grad(a, b, gemm.pick(cfgs.dh, t)),
                "dw2": lambda: gemm.weight_grad(a, b, gemm.pick(cfgs.dw2, t), dw_dtype=torch.float32,
                                                db_dtype=None)[0]}
        try:
            rec["tf32x3 default"] = {"err": rel(tens[name](), ref), "us": timed_us(tens[name], dev, reps)}
        except Exception as exc:
            rec["tf32x3 default"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        if dev.type == "cuda":
            for label, tf32 in (("cublas fp32", False), ("cublas tf32", True)):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                fn = lambda: av @ bv
                rec[label] = {"err": rel(fn(), ref), "us": timed_us(fn, dev, reps)}
            torch.backends.cuda.matmul.allow_tf32 = False
            ah, bh = av.half(), bv.half()
            rec["cublas fp16 one pass (speed of light)"] = {"us": timed_us(lambda: ah @ bh, dev, reps)}
        print(name, json.dumps(rec), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--dry-run", action="store_true", help="CPU, interpreter, tiny shapes: checks the script")
    args = ap.parse_args()
    if args.dry_run:
        dev, t, d, d_out, configs = torch.device("cpu"), 32, 64, 32, [(16, 16, 32, 4, 2)]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("tools.probe_fp16x3 times tensor-core GEMMs and needs a CUDA GPU (or --dry-run)")
        dev, t, d, d_out, configs = torch.device("cuda"), 2048, 5376, 2688, CONFIGS
    torch.backends.cuda.matmul.allow_tf32 = False
    report = {"T": t, "hidden": d, "out": d_out}
    try:
        report.update(probe(dev, t, d, d_out, args.reps, configs, args.budget))
    except Exception:
        report["error"] = traceback.format_exc()[-3000:]
        print(report["error"])
    with open(f"{args.out}/probe_fp16x3.json", "w") as handle:
        json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
