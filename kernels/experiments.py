"""Diagnostic variants of the forward kernel, kept to reproduce kernels/NOTES.md (not used by the op).

    python -m kernels.experiments --out DIR

Times GPU kernels with torch.profiler (CUPTI: device time only, no host launch cost) and, separately,
the host cost of one launch, so the two can be told apart.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
import triton
import triton.language as tl

from harness.environment import measure_copy_bandwidth
from harness.ops.norm_modulate import OP, NormModulateParams
from kernels import norm_modulate as K
from kernels.api import norm_modulate
from kernels.hostcost import host_us
from kernels.norm_modulate import _rounded


@triton.jit(do_not_specialize=["n_rows"])
def _fwd_variant(X, W, SH, SC, IDX, Y, RSTD, n_rows, H, M, stride_x, stride_y, stride_sh, stride_sc, eps,
                 BLOCK_H: tl.constexpr, HINTS: tl.constexpr, TABLES: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    m = tl.load(IDX + row).to(tl.int64)
    if HINTS:
        x = tl.load(X + row.to(tl.int64) * stride_x + cols, mask=col_ok, other=0.0,
                    cache_modifier=".cg").to(tl.float32)
    else:
        x = tl.load(X + row.to(tl.int64) * stride_x + cols, mask=col_ok, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if TABLES:
        sh = tl.load(SH + m * stride_sh + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
        sc = tl.load(SC + m * stride_sc + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    else:
        sh = tl.zeros((BLOCK_H,), dtype=tl.float32)
        sc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    y = (x * rstd) * (w * (1.0 + sc)) + sh
    if HINTS:
        tl.store(Y + row.to(tl.int64) * stride_y + cols, y.to(Y.dtype.element_ty), mask=col_ok,
                 cache_modifier=".cs")
    else:
        tl.store(Y + row.to(tl.int64) * stride_y + cols, y.to(Y.dtype.element_ty), mask=col_ok)
    tl.store(RSTD + row, rstd)


@triton.jit
def _sglang_control(y_ptr, x_ptr, w_ptr, scale_ptr, shift_ptr, idx_ptr, mod_row_stride, DIM: tl.constexpr,
                    EPS: tl.constexpr, BLOCK: tl.constexpr):
    """SGLang 0.5.23's rmsnorm_indexed_scale_shift kernel, as shipped, as the control."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < DIM
    mod = tl.load(idx_ptr + row) * mod_row_stride + cols
    x = tl.load(x_ptr + row * DIM + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / DIM + EPS)
    w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    scale = tl.load(scale_ptr + mod, mask=mask).to(tl.float32)
    shift = tl.load(shift_ptr + mod, mask=mask).to(tl.float32)
    tl.store(y_ptr + row * DIM + cols, (x * rstd * w) * (1.0 + scale) + shift, mask=mask)


@triton.jit
def _ours_1d(Y, X, W, SC, SH, IDX, RSTD, stride, H: tl.constexpr, eps, BLOCK: tl.constexpr,
             ROUND: tl.constexpr, STORE_RSTD: tl.constexpr, PRECISE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    m = tl.load(IDX + row).to(tl.int64)
    x = tl.load(X + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    if PRECISE:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    else:
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(W + cols, mask=mask).to(tl.float32)
    sc = tl.load(SC + m * stride + cols, mask=mask).to(tl.float32)
    sh = tl.load(SH + m * stride + cols, mask=mask).to(tl.float32)
    y = (x * rstd) * (w * (1.0 + sc)) + sh
    if ROUND:
        tl.store(Y + row * H + cols, _rounded(y, Y.dtype.element_ty, True), mask=mask)
    else:
        tl.store(Y + row * H + cols, y.to(Y.dtype.element_ty), mask=mask)
    if STORE_RSTD:
        tl.store(RSTD + row, rstd)


def prefer_l1(compiled) -> str:
    """Ask the driver for the largest L1 (smallest shared-memory carve-out) for this kernel."""
    try:
        from cuda.bindings import driver
        compiled._init_handles()
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        (err,) = driver.cuFuncSetAttribute(driver.CUfunction(compiled.function), attr, 0)
        return str(err)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@triton.jit
def _copy_rows(X, Y, H, stride, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    tl.store(Y + row * stride + cols, tl.load(X + row * stride + cols, mask=cols < H), mask=cols < H)


def profile(fn, reps=30, warmup=5) -> dict[str, float]:
    """Median device time per kernel name over `reps` calls of fn (profiled after warm-up)."""
    try:
        for _ in range(warmup):
            fn()
    except Exception as exc:  # a variant that does not compile is a line in the log
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"}
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per_name = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per_name[ev.name].append(ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total)
    out = {}
    for name, times in per_name.items():
        times.sort()
        out[name[:60]] = round(times[len(times) // 2], 2) * (len(times) / reps)
    return out


def _forward_variants(res, x, w, sh, sc, idx, y, rstd, rows, hidden) -> None:
    """Versions 2, 3 and 8 of kernels/NOTES.md: table loads on/off, cache hints, max-L1 carve-out."""
    block = triton.next_power_of_2(hidden)
    def launch(tables: bool):
        return _fwd_variant[(rows,)](x, w, sh, sc, idx, y, rstd, rows, hidden, sh.shape[0], x.stride(0),
                                     y.stride(0), sh.stride(0), sc.stride(0), 1e-5, BLOCK_H=block, HINTS=True,
                                     TABLES=tables, num_warps=8)
    for tables in (True, False):
        res[f"fwd_variant hints tables={tables}"] = profile(lambda: launch(tables))
    res["carveout"] = prefer_l1(launch(True))  # the question: do the tables stay in a larger L1?
    res["fwd_variant hints tables=True L1-preferred"] = profile(lambda: launch(True))
    res["copy_rows kernel"] = profile(lambda: _copy_rows[(rows,)](x, y, hidden, x.stride(0), BLOCK_H=block,
                                                                  num_warps=8))


def _ablation(x, w, sh, sc, idx, y, rstd, rows, hidden) -> None:
    """Version 8: SGLang's kernel as the control, then ours with one difference at a time."""
    block = triton.next_power_of_2(hidden)
    print("sglang control", profile(lambda: _sglang_control[(rows,)](y, x, w, sc, sh, idx, sc.stride(0), DIM=hidden,
                                                                      EPS=1e-5, BLOCK=block, num_warps=8)))
    for rnd, st, pr in ((False, False, False), (True, False, False), (False, True, False), (False, False, True),
                        (True, True, True)):
        print(f"ours round={rnd} rstd={st} precise={pr}", profile(lambda: _ours_1d[(rows,)](
            y, x, w, sc, sh, idx, rstd, sc.stride(0), hidden, 1e-5, BLOCK=block, ROUND=rnd, STORE_RSTD=st,
            PRECISE=pr, num_warps=8)))
    print("production", profile(lambda: K.forward(x, w, sh, sc, idx, 1e-5)))
    print("production, no rstd", profile(lambda: K.forward(x, w, sh, sc, idx, 1e-5, save_rstd=False)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=5376)
    ap.add_argument("--out", default=None)
    ap.add_argument("--ablation", action="store_true", help="only the forward ablation (version 8)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw, _ = measure_copy_bandwidth(dev)
    params = NormModulateParams(hidden=args.hidden)
    report = {"bandwidth_gbps": bw, "rows": args.rows, "hidden": args.hidden}
    for rows in ((args.rows,) if args.ablation else (args.rows, 4097)):
        t = OP.make_inputs(params, rows, 11, dev).tensors
        x, w, sh, sc, idx = (t[n] for n in ("x", "w", "sh", "sc", "idx"))
        dy = OP.make_grad_out(params, rows, 9, dev)
        y, rstd = torch.empty_like(x), torch.empty(rows, dtype=torch.float32, device=dev)
        if args.ablation:
            _ablation(x, w, sh, sc, idx, y, rstd, rows, args.hidden)
            return
        res = {"floor_fwd_us": OP.floor_bytes(params, rows, False) / (bw * 1e3),
               "floor_fwd_bwd_us": OP.floor_bytes(params, rows, True) / (bw * 1e3)}
        _forward_variants(res, x, w, sh, sc, idx, y, rstd, rows, args.hidden)
        res["production fwd"] = profile(lambda: K.forward(x, w, sh, sc, idx, 1e-5))
        _, rstd_p = K.forward(x, w, sh, sc, idx, 1e-5)
        res["production bwd (params)"] = profile(
            lambda: K.backward(dy, x, w, sc, idx, rstd_p, sh.shape[0], sh.dtype, True))
        leaves = [v.detach().requires_grad_() for v in (x, w, sh, sc)]
        ones = torch.ones_like(x)

        def fwd_bwd():
            for leaf in leaves:
                leaf.grad = None
            norm_modulate(*leaves, idx, check_index=False).backward(ones)
        res["autograd fwd+bwd"] = profile(fwd_bwd)
        res["host us: autograd fwd+bwd"] = host_us(fwd_bwd)
        res["host us: K.forward"] = host_us(lambda: K.forward(x, w, sh, sc, idx, 1e-5))
        res["host us: api forward no grad"] = host_us(lambda: norm_modulate(x, w, sh, sc, idx, check_index=False))
        res["host us: torch.add tiny"] = host_us(lambda: torch.add(rstd[:4], 1))
        report[str(rows)] = res
        for key, val in res.items():
            print(rows, key, json.dumps(val) if isinstance(val, (dict, str)) else round(val, 2), flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
