"""Compile the GEMM ops' kernels as their launches would, for an NVIDIA target, without a GPU.

    python -m tools.compile_gemm [--rows 1,8,2048] [--arch 90] [--op timestep_mlp,adaln_projection,final_adaln_out]

The launchers of kernels/timestep_mlp.py and kernels/adaln_projection.py (and final_adaln_out's projection
GEMMs, `--op final_adaln_out`, T = --rows) run at the model's size on
CPU tensors with `kernels.gemm.launch` and `launch_keyed` replaced by a recorder; each recorded launch is compiled with
triton's own specialization rules emulated (ints equal to 1 become constants, 16-divisible pointers
and ints get the divisibility hint, `do_not_specialize` respected), and the cubin is read with
cuobjdump: registers, spill stack (LOCAL), shared memory, the dot instruction found in the PTX
(wgmma, mma.sync or fma) and a count of the SASS instructions that matter for a GEMM (FFMA, HGMMA,
LDS*, LDGSTS, LDG, STG, ...). Two launches that compile to the same key are the same binary: the
forward of the bf16 op at T = 1 and T = 2048 must show the same numbers.

Triton here is this machine's; the GPU machine runs triton 3.6: install that wheel in a scratch venv
(its python sources and ptxas are all this needs) to check what the GPU will compile.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from collections import Counter

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

from h3bench.kernels import adaln_projection as AP
from h3bench.kernels import final_adaln_out as FA
from h3bench.kernels import gemm
from h3bench.kernels import timestep_mlp as TM

DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32"}
SASS_KEYS = ("FFMA", "HGMMA", "HMMA", "LDS", "LDSM", "LDGSTS", "LDG", "STG", "STS", "BAR", "SHFL", "UTMALDG", "UTMASTG")


def _source(kernel, args, meta):
    names, params = kernel.arg_names, kernel.params
    skip = set(kernel.do_not_specialize or [])
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if params[i].is_constexpr:
            consts[name], sig[name] = meta[name], "constexpr"
            continue
        a = args[i]
        free = name in skip or i in skip
        if isinstance(a, torch.Tensor):
            sig[name] = "*" + DTYPES[a.dtype]
            if a.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, bool):
            sig[name] = "i1"
        elif isinstance(a, int):
            if a == 1 and not free:
                consts[name], sig[name] = 1, "constexpr"
            else:
                sig[name] = "i32" if -2 ** 31 <= a < 2 ** 31 else "i64"
                if a % 16 == 0 and not free:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    return ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)


def compile_launch(kernel, args, meta, arch: int) -> dict:
    options = {k: meta[k] for k in ("num_warps", "num_stages") if k in meta}
    compiled = triton.compile(_source(kernel, args, meta), target=GPUTarget("cuda", arch, 32), options=options)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    ops = Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and m.group(1).split(".")[0] in SASS_KEYS:
            ops[m.group(1)] += 1
    ptx = compiled.asm.get("ptx", "")
    dot = "wgmma" if "wgmma" in ptx else "mma.sync" if "mma.sync" in ptx else "fma" if "fma.rn.f32" in ptx else "-"
    reg = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    return {"regs": int(reg.group(1)) if reg else None, "spill_bytes": int(local.group(1)) if local else None,
            "smem": compiled.metadata.shared, "dot": dot, "sass": dict(sorted(ops.items()))}


def recorded(fn) -> list:
    calls = []
    real, real_keyed = gemm.launch, gemm.launch_keyed
    gemm.launch = lambda kernel, grid, *args, **meta: calls.append((kernel, grid, args, meta))
    gemm.launch_keyed = lambda kernel, grid, device, key, args, meta: calls.append((kernel, grid, args, meta))
    try:
        fn()
    finally:
        gemm.launch, gemm.launch_keyed = real, real_keyed
    return calls


def launches(op: str, rows: int, mlp: str = "DEFAULT", ada: str = "DEFAULT") -> list[tuple[str, callable]]:
    if op == "timestep_mlp":
        cf = getattr(TM, mlp)
        x, w1, b1 = torch.randn(rows, 256), torch.randn(5376, 256), torch.randn(5376)
        w2, b2 = torch.randn(2688, 5376), torch.randn(2688)
        h, z, dy = torch.randn(rows, 5376), torch.randn(rows, 5376), torch.randn(rows, 2688)
        return [
            ("fwd1", lambda: gemm.forward(x, w1, b1, gemm.pick(cf.fwd1, rows), out_dtype=torch.float32, out_silu=True,
                                          save_pre=True)),
            ("fwd2", lambda: gemm.forward(h, w2, b2, gemm.pick(cf.fwd2, rows), out_dtype=torch.float32)),
            ("dh", lambda: gemm.input_grad(dy, w2, gemm.pick(cf.dh, rows), dsilu_of=z)),
            ("dx", lambda: gemm.input_grad(z, w1, gemm.pick(cf.dx, rows))),
            ("dw2", lambda: gemm.weight_grad(dy, h, gemm.pick(cf.dw2, rows), dw_dtype=torch.float32,
                                             db_dtype=torch.float32, db_blocks=cf.db_blocks)),
            ("dw1", lambda: gemm.weight_grad(z, x, gemm.pick(cf.dw1, rows), dw_dtype=torch.float32,
                                             db_dtype=torch.float32, db_blocks=cf.db_blocks)),
        ]
    if op == "final_adaln_out":  # its projection's GEMMs (`triton_projection`, `triton_grads`); T = rows
        n, d = 2 * 5376, 2688
        w, b = torch.empty(n, d, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
        temb, dproj = torch.randn(rows, d), torch.empty(rows, n, dtype=torch.bfloat16)
        a = torch.empty(rows, d, dtype=torch.bfloat16)
        return [
            ("fwd", lambda: gemm.forward(temb, w, b, FA.PROJECTION_GEMM, out_dtype=torch.bfloat16, a_silu=True)),
            ("dtemb", lambda: gemm.input_grad(dproj, w, FA.PROJECTION_DX, dsilu_of=temb)),
            ("dw", lambda: gemm.weight_grad(dproj, a, FA.PROJECTION_DW, dw_dtype=torch.bfloat16,
                                            db_dtype=torch.bfloat16)),
        ]
    cf = getattr(AP, ada)
    n, d = 96768, 2688
    w, b = torch.empty(n, d, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
    temb, dy = torch.randn(rows, d), torch.empty(rows, n, dtype=torch.bfloat16)
    a = torch.empty(rows, triton.cdiv(d + 1, 16) * 16, dtype=torch.bfloat16)[:, :d]
    return [
        ("silu_cast", lambda: gemm.silu_cast(temb, torch.bfloat16, ones_column=True)),
        ("fwd", lambda: gemm.forward(a, w, b, gemm.pick(cf.fwd, rows), out_dtype=torch.bfloat16)),
        ("dx", lambda: gemm.input_grad(dy, w, gemm.pick(cf.dx, rows), dsilu_of=temb)),
        ("dw", lambda: gemm.weight_grad(dy, a, gemm.pick(cf.dw, rows), a_ones="stored", dw_dtype=torch.bfloat16,
                                        db_dtype=torch.bfloat16)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,8,2048")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--op", default="timestep_mlp,adaln_projection")
    parser.add_argument("--mlp", default="DEFAULT", help="MLPConfigs of kernels/timestep_mlp.py to compile, by name")
    parser.add_argument("--ada", default="DEFAULT", help="ProjectionConfigs of kernels/adaln_projection.py, by name")
    args = parser.parse_args()
    print(f"triton {triton.__version__}, target sm_{args.arch}")
    for op in args.op.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            for label, fn in launches(op, rows, args.mlp, args.ada):
                for kernel, grid, kargs, meta in recorded(fn):
                    tile = "x".join(str(meta[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in meta)
                    head = (f"{op} T={rows} {label} grid={grid} {tile} w{meta.get('num_warps')} "
                            f"s{meta.get('num_stages', '-')} split={meta.get('SPLIT_K', '-')}")
                    try:
                        r = compile_launch(kernel, kargs, meta, args.arch)
                        print(f"{head}: regs {r['regs']}, spills {r['spill_bytes']} B, smem {r['smem']} B, "
                              f"dot {r['dot']}\n    {' '.join(f'{k}:{v}' for k, v in r['sass'].items())}", flush=True)
                    except Exception as exc:
                        print(f"{head}: FAILED {type(exc).__name__}: {str(exc)[:1500]}", flush=True)


if __name__ == "__main__":
    main()
