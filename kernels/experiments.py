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


@triton.jit(do_not_specialize=["n_rows"])
def _fwd_sorted(X, W, SH, SC, Y, RSTD, PERM, SEG_START, CHUNK_START, n_rows, H, M, stride_x, stride_y,
                stride_sh, stride_sc, eps, CHUNK, BLOCK_H: tl.constexpr, M_P2: tl.constexpr):
    """One table row per program (rows grouped by the segment plan): w, sh, sc stay in registers."""
    pid = tl.program_id(0)
    ks = tl.arange(0, M_P2)
    ends = tl.load(CHUNK_START + 1 + ks, mask=ks < M, other=2147483647)
    m = tl.sum((ends <= pid).to(tl.int32), axis=0)
    valid = m < M
    m_safe = tl.minimum(m, M - 1)
    first_chunk = tl.load(CHUNK_START + m_safe)
    seg_hi = tl.load(SEG_START + m_safe + 1)
    lo = tl.load(SEG_START + m_safe) + (pid - first_chunk) * CHUNK
    hi = tl.where(valid, tl.minimum(lo + CHUNK, seg_hi), lo)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    sh = tl.load(SH + m_safe.to(tl.int64) * stride_sh + cols, mask=col_ok, other=0.0).to(tl.float32)
    a = w * (1.0 + tl.load(SC + m_safe.to(tl.int64) * stride_sc + cols, mask=col_ok, other=0.0).to(tl.float32))
    for pos in range(lo, hi):
        r = tl.load(PERM + pos).to(tl.int64)
        x = tl.load(X + r * stride_x + cols, mask=col_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
        tl.store(Y + r * stride_y + cols, ((x * rstd) * a + sh).to(Y.dtype.element_ty), mask=col_ok,
                 cache_modifier=".cs")
        tl.store(RSTD + r, rstd)


@triton.jit(do_not_specialize=["n_rows", "n_programs"])
def _bwd_rows_prefetch(X, DY, DX, W, SC, RSTD, PERM, SEG_START, CHUNK_START, PD, PS,
                       n_rows, n_programs, H, M, stride_x, stride_dy, stride_dx, stride_sc, CHUNK,
                       BLOCK_H: tl.constexpr, M_P2: tl.constexpr):
    """The production backward with the next row's loads issued before this row's arithmetic."""
    pid = tl.program_id(0)
    ks = tl.arange(0, M_P2)
    ends = tl.load(CHUNK_START + 1 + ks, mask=ks < M, other=2147483647)
    m = tl.sum((ends <= pid).to(tl.int32), axis=0)
    valid = m < M
    m_safe = tl.minimum(m, M - 1)
    first_chunk = tl.load(CHUNK_START + m_safe)
    seg_hi = tl.load(SEG_START + m_safe + 1)
    lo = tl.load(SEG_START + m_safe) + (pid - first_chunk) * CHUNK
    hi = tl.where(valid, tl.minimum(lo + CHUNK, seg_hi), lo)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    a = w * (1.0 + tl.load(SC + m_safe.to(tl.int64) * stride_sc + cols, mask=col_ok, other=0.0).to(tl.float32))
    acc_d = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc_s = tl.zeros((BLOCK_H,), dtype=tl.float32)
    has = lo < hi
    r_next = tl.load(PERM + lo, mask=has, other=0).to(tl.int64)
    x_next = tl.load(X + r_next * stride_x + cols, mask=col_ok & has, other=0.0)
    dy_next = tl.load(DY + r_next * stride_dy + cols, mask=col_ok & has, other=0.0)
    for pos in range(lo, hi):
        r = r_next
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        has = pos + 1 < hi
        r_next = tl.load(PERM + pos + 1, mask=has, other=0).to(tl.int64)
        x_next = tl.load(X + r_next * stride_x + cols, mask=col_ok & has, other=0.0)
        dy_next = tl.load(DY + r_next * stride_dy + cols, mask=col_ok & has, other=0.0)
        rstd = tl.load(RSTD + r)
        xhat = x * rstd
        g = dy * a
        c = tl.sum(g * xhat, axis=0) / H
        tl.store(DX + r * stride_dx + cols, ((g - xhat * c) * rstd).to(DX.dtype.element_ty), mask=col_ok)
        acc_d += dy
        acc_s += dy * xhat
    out = pid.to(tl.int64) * H + cols
    written = cols < tl.where(valid, H, 0)
    tl.store(PD + out, acc_d, mask=written)
    tl.store(PS + out, acc_s, mask=written)


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
        tl.store(Y + row * H + cols, _rounded(y, Y.dtype.element_ty), mask=mask)
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


def host_launch_us(fn, reps=200) -> float:
    """Host wall time per call with the GPU kept idle-free: how long Python + launch take."""
    import time
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=5376)
    ap.add_argument("--out", default=None)
    ap.add_argument("--ablation", action="store_true", help="only the forward ablation")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw, _ = measure_copy_bandwidth(dev)
    params = NormModulateParams(hidden=args.hidden)
    report = {"bandwidth_gbps": bw, "rows": args.rows, "hidden": args.hidden}
    if args.ablation:
        rows = args.rows
        inputs = OP.make_inputs(params, rows, 11, dev)
        t = inputs.tensors
        x, w, sh, sc, idx = (t[n] for n in ("x", "w", "sh", "sc", "idx"))
        y = torch.empty_like(x)
        rstd = torch.empty(rows, dtype=torch.float32, device=dev)
        block = triton.next_power_of_2(args.hidden)
        print("floor", OP.floor_bytes(params, rows, False) / (bw * 1e3))
        print("sglang control", profile(lambda: _sglang_control[(rows,)](y, x, w, sc, sh, idx, sc.stride(0), DIM=args.hidden,
                                                                          EPS=1e-5, BLOCK=block, num_warps=8)))
        for rnd, st, pr in ((False, False, False), (True, False, False), (False, True, False), (False, False, True),
                            (True, True, True)):
            print(f"ours round={rnd} rstd={st} precise={pr}", profile(lambda: _ours_1d[(rows,)](
                y, x, w, sc, sh, idx, rstd, sc.stride(0), args.hidden, 1e-5, BLOCK=block, ROUND=rnd, STORE_RSTD=st,
                PRECISE=pr, num_warps=8)))
        print("production", profile(lambda: K.forward(x, w, sh, sc, idx, 1e-5)))
        print("production, no rstd", profile(lambda: K.forward(x, w, sh, sc, idx, 1e-5, save_rstd=False)))
        return
    for rows in (args.rows, 4097):
        inputs = OP.make_inputs(params, rows, 11, dev)
        t = inputs.tensors
        x, w, sh, sc, idx = (t[n] for n in ("x", "w", "sh", "sc", "idx"))
        dy = OP.make_grad_out(params, rows, 9, dev)
        y = torch.empty_like(x)
        rstd = torch.empty(rows, dtype=torch.float32, device=dev)
        block = triton.next_power_of_2(args.hidden)
        floor_fwd = OP.floor_bytes(params, rows, False) / (bw * 1e3)
        res = {"floor_fwd_us": floor_fwd, "floor_fwd_bwd_us": OP.floor_bytes(params, rows, True) / (bw * 1e3)}
        for warps in (8,):
            for hints in (True,):
                for tables in (True, False):
                    def launch():
                        _fwd_variant[(rows,)](x, w, sh, sc, idx, y, rstd, rows, args.hidden, sh.shape[0],
                                              x.stride(0), y.stride(0), sh.stride(0), sc.stride(0), 1e-5,
                                              BLOCK_H=block, HINTS=hints, TABLES=tables, num_warps=warps)
                    res[f"fwd_variant w{warps} hints={hints} tables={tables}"] = profile(launch)
        for pps in (4,):
            for warps in (8,):
                K.PROGRAMS_PER_SM = pps
                chunk = K.backward_chunk(rows, K.block_config(args.hidden), dev)
                plan = K.segment_plan(idx, sh.shape[0], chunk)
                res[f"fwd_sorted pps{pps} w{warps}"] = profile(lambda: _fwd_sorted[(plan.programs,)](
                    x, w, sh, sc, y, rstd, plan.perm, plan.seg_start, plan.chunk_start, rows, args.hidden,
                    sh.shape[0], x.stride(0), y.stride(0), sh.stride(0), sc.stride(0), 1e-5, plan.chunk,
                    BLOCK_H=block, M_P2=16, num_warps=warps))
        K.PROGRAMS_PER_SM = 2
        for warps in (4, 8):
            def launch_l1():
                return _fwd_variant[(rows,)](x, w, sh, sc, idx, y, rstd, rows, args.hidden, sh.shape[0],
                                             x.stride(0), y.stride(0), sh.stride(0), sc.stride(0), 1e-5,
                                             BLOCK_H=block, HINTS=True, TABLES=True, num_warps=warps)
            res[f"carveout w{warps}"] = prefer_l1(launch_l1())
            res[f"fwd_variant w{warps} hints=True tables=True L1-preferred"] = profile(launch_l1)
        _, rstd_b = K.forward(x, w, sh, sc, idx, 1e-5)
        dx = torch.empty_like(x)
        for pps in (1, 2, 4):
            for warps in (8, 16, 32):
                K.PROGRAMS_PER_SM = pps
                chunk = K.backward_chunk(rows, K.block_config(args.hidden), dev)
                plan = K.segment_plan(idx, sh.shape[0], chunk)
                pd = torch.empty((plan.programs, args.hidden), dtype=torch.float32, device=dev)
                ps = torch.empty_like(pd)
                for stages in (1, 3):
                    res[f"bwd_rows_prefetch pps{pps} w{warps} st{stages}"] = profile(
                        lambda: _bwd_rows_prefetch[(plan.programs,)](
                            x, dy, dx, w, sc, rstd_b, plan.perm, plan.seg_start, plan.chunk_start, pd, ps, rows,
                            plan.programs, args.hidden, sh.shape[0], x.stride(0), dy.stride(0), dx.stride(0),
                            sc.stride(0), plan.chunk, BLOCK_H=block, M_P2=16, num_warps=warps, num_stages=stages))
                res[f"bwd_rows production pps{pps} w{warps} st1"] = profile(
                    lambda: K._bwd_rows_kernel[(plan.programs,)](
                        x, dy, dx, w, sc, rstd_b, plan.perm, plan.seg_start, plan.chunk_start, pd, ps, rows,
                        plan.programs, args.hidden, sh.shape[0], x.stride(0), dy.stride(0), dx.stride(0),
                        sc.stride(0), plan.chunk, BLOCK_H=block, ROWS=1, M_P2=16, num_warps=warps, num_stages=1))
                if warps == 8:
                    w_, dsh_, dsc_ = torch.empty_like(w), torch.empty_like(sh), torch.empty_like(sc)
                    for bc, pt in ((32, 32), (64, 64), (16, 64)):
                        res[f"bwd_params pps{pps} C{bc} P{pt}"] = profile(
                            lambda: K._bwd_params_kernel[(triton.cdiv(args.hidden, bc),)](
                                pd, ps, plan.chunk_start, w, sc, w_, dsh_, dsc_, args.hidden, sh.shape[0],
                                sc.stride(0), dsh_.stride(0), dsc_.stride(0), BLOCK_C=bc, P_TILE=pt, num_warps=4))
        K.PROGRAMS_PER_SM = 2
        res["copy_rows kernel w8"] = profile(lambda: _copy_rows[(rows,)](x, y, args.hidden, x.stride(0),
                                                                          BLOCK_H=block, num_warps=8))
        res["production fwd"] = profile(lambda: K.forward(x, w, sh, sc, idx, 1e-5))
        _, rstd_p = K.forward(x, w, sh, sc, idx, 1e-5)
        cfg = K.block_config(args.hidden)
        chunk = K.backward_chunk(rows, cfg, dev)
        res["segment_plan"] = profile(lambda: K.segment_plan(idx, sh.shape[0], chunk))
        res["production bwd (params)"] = profile(
            lambda: K.backward(dy, x, w, sc, idx, rstd_p, sh.shape[0], sh.dtype, True))
        leaves = [v.detach().requires_grad_() for v in (x, w, sh, sc)]
        ones = torch.ones_like(x)

        def fwd_bwd():
            for leaf in leaves:
                leaf.grad = None
            norm_modulate(*leaves, idx, check_index=False).backward(ones)
        res["autograd fwd+bwd"] = profile(fwd_bwd)
        res["host us: autograd fwd+bwd"] = host_launch_us(fwd_bwd)
        res["host us: K.forward"] = host_launch_us(lambda: K.forward(x, w, sh, sc, idx, 1e-5))
        res["host us: api forward no grad"] = host_launch_us(
            lambda: norm_modulate(x, w, sh, sc, idx, check_index=False))
        res["host us: torch.add tiny"] = host_launch_us(lambda: torch.add(rstd[:4], 1))
        res["host us: segment_plan"] = host_launch_us(lambda: K.segment_plan(idx, sh.shape[0], chunk))
        report[str(rows)] = res
        for key, val in res.items():
            print(rows, key, json.dumps(val) if isinstance(val, (dict, str)) else round(val, 2), flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
