"""Compile the norm_modulate kernels for an NVIDIA target without a GPU, and report registers and spills.

    python -m tools.compile_norm_modulate --hidden 1024,5376,12288 [--arch 90] [--params on|off] [--bwd-fp-fusion]

Triton compiles for a target (GPUTarget("cuda", 90, 32) = H100/H200) with its bundled ptxas; cuobjdump
reads the registers per thread and the spill stack (bytes per thread) of the cubin. No GPU is used, so
this runs anywhere triton's NVIDIA backend is installed. The numbers are this machine's triton and ptxas
(they can differ a little from the GPU machine's). Every kernel and every launch configuration the
launchers can pick for that H is compiled, so a kernel that only the interpreter accepts shows up here.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import tempfile

import triton

from h3bench.kernels import norm_modulate_kernel as K

POINTERS = {"X": "bf16", "DY": "bf16", "DX": "bf16", "Y": "bf16", "W": "bf16", "SH": "bf16", "SC": "bf16",
            "IDX": "i64", "ORDER": "i64", "KEYS": "i64", "SCRATCH": "i32", "RSTD": "fp32", "PART": "fp32",
            "DSH": "bf16", "DSC": "bf16", "DW": "bf16", "C": "fp32", "WORK": "i32"}


def _signature(kernel, constexprs: dict) -> dict:
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in POINTERS:
            sig[name] = "*" + POINTERS[name]
        elif name == "eps":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_for(kernel, constexprs: dict, num_warps: int, arch: int = 90):
    """`kernel` compiled for the target with `constexprs` (and the launch option `enable_fp_fusion` when it
    is among them: the backward's, `_bwd_recipe`). Not under TRITON_INTERPRET (its kernels do not compile)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    options = {"num_warps": num_warps}
    if "enable_fp_fusion" in constexprs:
        constexprs = dict(constexprs)
        options["enable_fp_fusion"] = constexprs.pop("enable_fp_fusion")
    src = ASTSource(kernel, _signature(kernel, constexprs), constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def resources(kernel, constexprs: dict, num_warps: int, arch: int = 90) -> dict:
    compiled = compile_for(kernel, constexprs, num_warps, arch)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as handle:
        handle.write(compiled.asm["cubin"])
        path = handle.name
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    text = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
    os.unlink(path)
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", text)
    regs, stack, shared = (int(v) for v in found.groups()) if found else (-1, -1, -1)
    return {"regs": regs, "spill_stack_bytes": stack, "shared": shared + compiled.metadata.shared,
            "warps": num_warps}


def kernels_for(hidden: int, cfg: K.LaunchConfig, table_rows: int = 9) -> list[tuple[str, object, dict, int]]:
    """(label, kernel, constexprs, warps) of every launch `forward` and `backward` can make for `hidden`
    (CMAX 256: R = 32768 on 132 SMs); the backward with FMA contraction on where `cfg.bwd_fp_fusion` says so,
    as it was compiled before its launches turned it off (kernels/notes/norm_modulate.md), for comparison."""
    head, tail = K._head_tail(hidden)
    out = [("fwd rows", K._fwd_rows_kernel,
            dict(H=hidden, ROWS=cfg.fwd_rows, HEAD=head, TAIL=tail, L1_TABLES=cfg.fwd_l1_tables, RELOAD=cfg.fwd_reload,
                 SAVE_RSTD=True, BY_HAND=False), cfg.fwd_warps)]
    if K.walks_plan(cfg):   # under the global plan
        out.append(("fwd plan walk", K._fwd_walk_kernel,
                    dict(H=hidden, BLOCK_H=cfg.block_h, ROWS=cfg.plan_walk_rows, CMAX=256, K_P2=2, SAVE_RSTD=True,
                         BY_HAND=False), cfg.plan_walk_warps))
    for plan in (False, True):
        k_p2 = 2 if plan else triton.next_power_of_2(table_rows + 2)
        common = dict(H=hidden, CMAX=256, K_P2=k_p2, GLOBAL=plan, PARAMS=True, BY_HAND=False,
                      enable_fp_fusion=cfg.bwd_fp_fusion)
        if cfg.bwd_cols:
            out.append((f"bwd split global={plan}", K._bwd_kernel,
                        dict(common, BLOCK_H=cfg.bwd_cols, ROWS=cfg.bwd_rows, COLS=True), cfg.bwd_warps))
        else:
            out.append((f"bwd global={plan}", K._bwd_kernel,
                        dict(common, BLOCK_H=cfg.block_h, ROWS=cfg.bwd_rows, COLS=False), cfg.bwd_warps))
    if cfg.bwd_cols:
        dots = K.dots_meta(hidden, cfg)
        warps = dots.pop("num_warps")
        out.append(("bwd split dots", K._bwd_dots_kernel, dots, warps))
    out.append(("params", K._bwd_params_kernel, dict(H=hidden, BLOCK_C=32, P_TILE=256, BY_HAND=False), 4))
    out.append(("combine", K._bwd_combine_kernel, dict(H=hidden, BLOCK_C=128, P_TILE=32, BY_HAND=False), 4))
    out.extend(plan_kernels())
    return out


def plan_kernels() -> list[tuple[str, object, dict, int]]:
    """The global plan's three launches (kernels/plan.py) at the default block."""
    from h3bench.kernels import plan as P
    chunk, warps = P._chunk_and_warps(P.BLOCK)
    return [("plan count", P._count_kernel, dict(BLOCK=P.BLOCK, CHUNK=chunk, ZERO=P.ZERO_CHUNK), warps),
            ("plan scan", P._scan_kernel, dict(BUCKETS=P.SCAN_BUCKETS, BLOCKS=P.SCAN_BLOCKS), 4),
            ("plan place", P._place_kernel, dict(BLOCK=P.BLOCK, SCAN_BUCKETS=P.SCAN_BUCKETS,
                                                    CHUNKS=P.PLACE_CHUNKS), warps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", default="1024,2048,3072,4096,5376,8192,12288,32768")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--params", choices=("on", "off"), default="on",
                        help="the backward with parameter gradients (PARAMS) or without")
    parser.add_argument("--bwd-fp-fusion", action="store_true",
                        help="compile the backward with FMA contraction on (its launches turn it off; the same "
                             "as --set bwd_fp_fusion=True)")
    parser.add_argument("--set", action="append", default=[],
                        help="override a LaunchConfig field for every H, e.g. --set bwd_cols=2048")
    args = parser.parse_args()
    for hidden in (int(v) for v in args.hidden.split(",")):
        cfg = K.launch_config(hidden)
        for item in args.set:
            name, value = item.split("=")
            field_type = type(getattr(cfg, name))
            cfg = dataclasses.replace(cfg, **{name: value == "True" if field_type is bool else int(value)})
        if args.bwd_fp_fusion:
            cfg = dataclasses.replace(cfg, bwd_fp_fusion=True)
        for label, kernel, constexprs, warps in kernels_for(hidden, cfg):
            if "PARAMS" in constexprs:
                constexprs = dict(constexprs, PARAMS=args.params == "on")
            print(f"H={hidden:6d} {label:28s} {resources(kernel, constexprs, warps, args.arch)}", flush=True)


if __name__ == "__main__":
    main()
