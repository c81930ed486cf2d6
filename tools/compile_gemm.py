"""Compile the GEMM ops' default launches for an NVIDIA target, without a GPU.

    python -m tools.compile_gemm [--op timestep_mlp,adaln_projection,final_adaln_out] [--rows 1,16,17,64,65,2048]
                                 [--arch 90] [--hash]

Each op runs at the model's size on CPU tensors with `kernels.gemm.launch` and `launch_keyed` replaced by a
recorder: a no-grad forward, then a forward and a backward with every gradient (timestep_mlp and
adaln_projection through their public functions with the GPU's config set; final_adaln_out's projection,
the part of it that launches kernels/gemm.py; T is its table's rows).
Each recorded launch is compiled with triton's own specialization rules emulated (ints equal to 1 become
constants, 16-divisible pointers and ints get the divisibility hint, `do_not_specialize` respected) and its
cubin read with cuobjdump: registers, spill stack (LOCAL), shared memory, the dot instruction found in the
PTX (wgmma, mma.sync or fma) and a count of the SASS instructions that matter for a GEMM (FFMA, HGMMA,
LDS*, LDGSTS, LDG, STG, ...).

`--hash` adds each launch's SASS hashed twice: as printed (encodings left out), and with every operand
that reads a kernel parameter from the constant bank (c[0x0][...]) written as the parameter's name, so that
a change to the kernel's argument list alone (offsets move) keeps the second hash. Two runs before and
after a change that must not touch the default kernels compare launch by launch.

Triton here is this machine's; the GPU machine may run another version: install that wheel in a scratch
venv (its python sources and ptxas are all this needs) to check what the GPU will compile.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import subprocess
import tempfile
from collections import Counter

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

from h3bench.kernels import adaln_projection_api as AP
from h3bench.kernels import final_adaln_out_kernel as FA
from h3bench.kernels import gemm
from h3bench.kernels import timestep_mlp_api as TM

DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32"}
SASS_KEYS = ("FFMA", "HGMMA", "HMMA", "LDS", "LDSM", "LDGSTS", "LDG", "STG", "STS", "BAR", "SHFL", "UTMALDG", "UTMASTG")
OPS = ("timestep_mlp", "adaln_projection", "final_adaln_out")
# the model's widths (configs/<op>/default.toml); `small` ones for the tests: the same launches, less memory
MODEL = {"freq": 256, "hidden": 5376, "temb": 2688, "table": 96768}
SMALL = {"freq": 16, "hidden": 64, "temb": 64, "table": 96}
PARAM_BASE = 0x210   # sm_90: a kernel's parameters start at c[0x0][0x210]


def _source(kernel, args, meta):
    """(ASTSource, names of the kernel's runtime parameters in order) for a launch's arguments."""
    names, params = kernel.arg_names, kernel.params
    skip = set(kernel.do_not_specialize or [])
    sig, consts, attrs, runtime = {}, {}, {}, []
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
                continue
            sig[name] = "i32" if -2 ** 31 <= a < 2 ** 31 else "i64"
            if a % 16 == 0 and not free:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
        runtime.append(name)
    return ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs), runtime


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sass_hashes(sass: str, elf: str, runtime: list[str]) -> tuple[str, str]:
    """(hash of the SASS instructions, hash of the same with parameter operands named): the instruction
    lines without their encodings; parameters by KPARAM_INFO's ordinal and offset (trailing ones the
    compiler adds are named scratchN)."""
    body = "\n".join(re.sub(r"\s*/\* 0x[0-9a-f]+ \*/", "", line).strip() for line in sass.splitlines()
                     if re.match(r"\s*/\*[0-9a-f]{4}\*/", line))
    params = {int(m.group(1), 16): (int(m.group(2), 16), int(m.group(3), 16)) for m in re.finditer(
        r"Ordinal\s*:\s*0x([0-9a-f]+)\s+Offset\s*:\s*0x([0-9a-f]+)\s+Size\s*:\s*0x([0-9a-f]+)", elf)}
    names = runtime + [f"scratch{i}" for i in range(len(params) - len(runtime))]
    by_offset = {PARAM_BASE + off + d: f"{names[ordinal]}+{d}" for ordinal, (off, size) in params.items()
                 for d in range(size)}

    def named(m):
        offset = int(m.group(1), 16)
        return f"c[0x0][{by_offset[offset]}]" if offset in by_offset else m.group(0)
    return _sha(body), _sha(re.sub(r"c\[0x0\]\[0x([0-9a-f]+)\]", named, body))


_COMPILED: dict = {}


def compile_launch(kernel, args, meta, arch: int) -> dict:
    """What the launch compiles to (compiled once per specialization: kernel, signature, constants, hints,
    options and target)."""
    src, runtime = _source(kernel, args, meta)
    options = {k: meta[k] for k in ("num_warps", "num_stages") if k in meta}
    key = repr((kernel.fn.__name__, sorted(src.signature.items()), sorted(map(repr, src.constants.items())),
                sorted(src.attrs.items()), sorted(options.items()), arch))
    if key not in _COMPILED:
        _COMPILED[key] = _compiled(src, runtime, options, arch)
    return _COMPILED[key]


def _compiled(src, runtime, options, arch: int) -> dict:
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        elf = subprocess.run([tool, "-elf", f.name], capture_output=True, text=True).stdout
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
            "smem": compiled.metadata.shared, "dot": dot, "sass": dict(sorted(ops.items())),
            "hashes": sass_hashes(sass, elf, runtime)}


def recorded(fn) -> list:
    """The launches `fn` makes through kernels/gemm.py, recorded instead of made: (kernel, grid, args, meta).
    The ops' argument checks are passed over (CPU tensors outside the interpreter are what they refuse)."""
    calls = []
    saved = (gemm.launch, gemm.launch_keyed, TM._check, AP._check)
    gemm.launch = lambda kernel, grid, *args, **meta: calls.append((kernel, grid, args, meta))
    gemm.launch_keyed = lambda kernel, grid, device, key, args, meta: calls.append((kernel, grid, args, meta))
    TM._check = AP._check = lambda *args: None
    try:
        fn()
    finally:
        gemm.launch, gemm.launch_keyed, TM._check, AP._check = saved
    return calls


def _timestep_mlp(rows: int, w: dict, grad: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, w["freq"], generator=g)
    w1, b1 = torch.randn(w["hidden"], w["freq"], generator=g) * 0.06, torch.randn(w["hidden"], generator=g)
    w2, b2 = torch.randn(w["temb"], w["hidden"], generator=g) * 0.01, torch.randn(w["temb"], generator=g)
    with torch.no_grad() if not grad else contextlib.nullcontext():
        leaves = [t.requires_grad_(grad) for t in (x, w1, b1, w2, b2)]
        out = TM.timestep_mlp(*leaves)
        if grad:
            out.backward(torch.randn(rows, w["temb"], generator=g))


def _adaln_projection(rows: int, w: dict, grad: bool) -> None:
    temb = torch.randn(rows, w["temb"])
    weight = torch.randn(w["table"], w["temb"]).to(torch.bfloat16)
    bias = torch.zeros(w["table"], dtype=torch.bfloat16)
    with torch.no_grad() if not grad else contextlib.nullcontext():
        leaves = [t.requires_grad_(grad) for t in (temb, weight, bias)]
        out = AP.adaln_projection(*leaves)
        if grad:
            out.backward(torch.randn(rows, w["table"]).to(torch.bfloat16))


def _final_adaln_out(rows: int, w: dict, grad: bool) -> None:
    """final_adaln_out's projection (`_project`, `_projection_grads`); T = rows."""
    temb = torch.randn(rows, w["temb"])
    weight = torch.randn(2 * w["hidden"], w["temb"]).to(torch.bfloat16)
    bias = torch.zeros(2 * w["hidden"], dtype=torch.bfloat16)
    temb, a, _ = FA._project(temb, weight, bias)
    if grad:
        dproj = torch.randn(rows, 2 * w["hidden"]).to(torch.bfloat16)
        FA._projection_grads(dproj, temb, a, weight, True, True, True)


def launches(op: str, rows: int, small: bool = False) -> list[tuple[str, callable]]:
    """(step, fn) of an op at T = rows: its no-grad forward, then its forward and backward."""
    run = {"timestep_mlp": _timestep_mlp, "adaln_projection": _adaln_projection,
           "final_adaln_out": _final_adaln_out}[op]
    widths = SMALL if small else MODEL
    return [(step, (lambda grad=grad: run(rows, widths, grad))) for step, grad in (("nograd", False), ("train", True))]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,16,17,64,65,2048", help="T (comma-separated)")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--op", default=",".join(OPS), help=f"ops (comma-separated: {', '.join(OPS)})")
    parser.add_argument("--hash", action="store_true", help="each launch's SASS hashes (module docstring)")
    args = parser.parse_args(argv)
    ops = [op for op in args.op.split(",") if op]
    if set(ops) - set(OPS):
        parser.error(f"--op: unknown {', '.join(sorted(set(ops) - set(OPS)))}")
    print(f"triton {triton.__version__}, target sm_{args.arch}")
    for op in ops:
        for rows in (int(r) for r in args.rows.split(",")):
            for step, fn in launches(op, rows):
                for i, (kernel, grid, kargs, meta) in enumerate(recorded(fn)):
                    tile = "x".join(str(meta[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in meta)
                    head = (f"{op} T={rows} {step} #{i} {kernel.fn.__name__} grid={grid} {tile} "
                            f"w{meta.get('num_warps')} s{meta.get('num_stages', '-')} split={meta.get('SPLIT_K', '-')}")
                    try:
                        r = compile_launch(kernel, kargs, meta, args.arch)
                        hashes = f" | sass {r['hashes'][0]} named {r['hashes'][1]}" if args.hash else ""
                        print(f"{head}: regs {r['regs']}, spills {r['spill_bytes']} B, smem {r['smem']} B, "
                              f"dot {r['dot']}{hashes}\n    {' '.join(f'{k}:{v}' for k, v in r['sass'].items())}",
                              flush=True)
                    except Exception as exc:
                        print(f"{head}: FAILED {type(exc).__name__}: {str(exc)[:1500]}", flush=True)


if __name__ == "__main__":
    main()
