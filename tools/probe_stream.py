"""How fast a GEMM2-shaped loop can read W2 at small T, by access pattern (a diagnostic, timing only).

    python -m tools.probe_stream [--json FILE]

timestep_mlp's swapped GEMM2 (kernels/gemm.py, v11) reads W2 [2688, 5376] fp32 (or, `presplit`, its two
fp16 halves) as [64, 32] tiles, six K chunks, one program a (tile, chunk): every candidate so far took
27-31 us, about what torch takes to read *and write* W2 (28.7 us, logs/session16-call-1), where cuBLAS's
gemv reads it in ~17 us. This kernel keeps that loop's loads and MMAs (a [ROWS, BLOCK_K] tile of W2 times a
[BLOCK_K, 16] operand, a fresh accumulator a step added into the running one, as the fp16x3 step does) and
drops the split, the scales and the h loads, over:
  layout   row-major W2 (as stored: each step reads BLOCK_K contiguous elements of ROWS rows), or
           tile-major (each (tile, step) block stored contiguously: one contiguous read a step)
  dtype    fp32 converted to fp16 in registers (the default's load), or fp16 halves (`presplit`'s: two
           arrays, or one)
  BLOCK_K, ROWS, stages.
If row-major reads stay near 28 us and tile-major ones fall toward the read floor, W2's access pattern is
GEMM2's bound and a tile-major `presplit` layout the fix; if both stay, the loop's own latency is. GPU only.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

N, K, SPLIT = 2688, 5376, 6


@triton.jit
def _stream_kernel(A, LO, OUT, steps_total, steps_per_chunk, stride_n, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                   TILED: tl.constexpr, TWO: tl.constexpr, TO16: tl.constexpr):
    tile = tl.program_id(0)
    first = tl.program_id(1) * steps_per_chunk
    r = tl.arange(0, ROWS)
    k = tl.arange(0, BLOCK_K)
    if TILED:   # block (tile, step) at ((tile * steps_total + step) * ROWS + r) * BLOCK_K + k
        offs = ((tile * steps_total + first) * ROWS + r).to(tl.int64)[:, None] * BLOCK_K + k[None, :]
        advance = ROWS * BLOCK_K
    else:
        offs = (tile * ROWS + r).to(tl.int64)[:, None] * stride_n + (first * BLOCK_K + k)[None, :]
        advance = BLOCK_K
    ones = (k[:, None] * 0 + tl.arange(0, 16)[None, :] * 0 + 1).to(tl.float16)
    acc = tl.zeros((ROWS, 16), dtype=tl.float32)
    for _ in range(steps_per_chunk):
        a = tl.load(A + offs)
        if TO16:
            a = a.to(tl.float16)
        step = tl.dot(a, ones)
        if TWO:
            step = tl.dot(tl.load(LO + offs), ones, step)
        acc += step * 0.5   # a fresh accumulator a step, scaled back into the running one
        offs += advance
    tl.store(OUT + (tl.program_id(1) * tl.num_programs(0) + tile) * ROWS + r, tl.sum(acc, 1))


def tile_major(w: torch.Tensor, rows: int, block_k: int) -> torch.Tensor:
    n, k = w.shape
    return w.view(n // rows, rows, k // block_k, block_k).permute(0, 2, 1, 3).contiguous()


def variants() -> dict:
    """name -> (dtype, two arrays, tiled, ROWS, BLOCK_K, stages, warps)."""
    out = {}
    for tiled in (False, True):
        lay = "tile" if tiled else "row"
        out[f"fp32_{lay}_r64_k32_s4"] = ("fp32", False, tiled, 64, 32, 4, 4)
        for stages in (2, 4, 6):
            out[f"fp16x2_{lay}_r64_k32_s{stages}"] = ("fp16", True, tiled, 64, 32, stages, 4)
        out[f"fp16x1_{lay}_r64_k32_s4"] = ("fp16", False, tiled, 64, 32, 4, 4)
        out[f"fp16x2_{lay}_r64_k64_s4"] = ("fp16", True, tiled, 64, 64, 4, 4)
        out[f"fp16x2_{lay}_r64_k128_s3"] = ("fp16", True, tiled, 64, 128, 3, 4)
        out[f"fp16x2_{lay}_r128_k32_s4"] = ("fp16", True, tiled, 128, 32, 4, 4)
        out[f"fp16x2_{lay}_r16_k32_s4_w1"] = ("fp16", True, tiled, 16, 32, 4, 1)
    return out


def launcher(w32: torch.Tensor, spec: tuple, out: torch.Tensor | None = None):
    """The variant `spec` over w32 [n, k] (n a multiple of its ROWS, k of BLOCK_K x SPLIT) as a call writing
    out [SPLIT * n] (each chunk's row sums, times 8: 16 columns of ones, halved)."""
    dtype, two, tiled, rows, block_k, stages, warps = spec
    n, k = w32.shape
    w = w32 if dtype == "fp32" else w32.half()
    lo = (w32 - w.float()).half() if two else w
    if tiled:
        w, lo = tile_major(w, rows, block_k), tile_major(lo, rows, block_k)
    steps = k // block_k
    out = torch.empty(SPLIT * n, device=w32.device, dtype=torch.float32) if out is None else out
    grid = (n // rows, SPLIT)

    def call():
        _stream_kernel[grid](w, lo, out, steps, steps // SPLIT, k, ROWS=rows, BLOCK_K=block_k, TILED=tiled,
                             TWO=two, TO16=dtype == "fp32", num_stages=stages, num_warps=warps)
    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_stream needs a CUDA device")
    from tools.kernel_times import summed_kernel_us
    dev = torch.device("cuda")
    w32 = torch.randn(N, K, device=dev)
    results = {
        "torch sum of W2 (reads)": summed_kernel_us(lambda: w32.sum(), a.reps, 3),
        "torch copy of W2 (reads and writes)": summed_kernel_us(lambda: w32.clone(), a.reps, 3),
        "torch fp16 sum of W2 halves (reads 2 x 28.9 MB)": None,
    }
    hi, lo = w32.half(), (w32 - w32.half().float()).half()
    results["torch fp16 sum of W2 halves (reads 2 x 28.9 MB)"] = summed_kernel_us(lambda: (hi.sum(), lo.sum()), a.reps, 3)
    for name, spec in variants().items():
        results[name] = summed_kernel_us(launcher(w32, spec), a.reps, 3)
        print(f"{name:32s} {results[name]:8.2f} us", flush=True)
    print("stream us", json.dumps(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": [N, K], "split": SPLIT, "kernel_us": results}, f, indent=1)


if __name__ == "__main__":
    main()
