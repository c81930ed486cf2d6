"""GPU check and timing of the batch-invariant GEMM ops (kernels/gemm.py), and a bench for their configs.

    python -m tools.bench_gemm --out gemm_bench.json                        (a CUDA GPU)
    python -m tools.bench_gemm --out x.json --skip-ops --candidate fwd2:1:64x16x32/w4/s4/k6/fp16x3/L/S
    python -m tools.bench_gemm --dry-run --out /tmp/x.json                 (CPU, under the interpreter)

For timestep_mlp and adaln_projection with their default configs, at the model's size and T in --rows:
  1. errors against float64 (output and every gradient, max|err| / max|ref|), ours and cuBLAS's
     (the `diffusers` composition: F.linear, F.silu, F.linear / F.linear(F.silu(temb).to(bf16), W, b),
     TF32 off);
  2. forward (no_grad), backward (autograd.grad of a kept graph) and forward+backward, CUDA events,
     back-to-back (`stream`), median of --reps after --warmup, twice; the forward also synchronized
     (each sample from an idle GPU: host cost included, as the harness's `fwd_us`) up to T = 8;
  3. the forward's weight-streaming bandwidth (the op's floor bytes / time, and its fraction of the
     measured copy bandwidth), and our time over cuBLAS's;
  4. batch invariance on the GPU: rows alone (T = 1), a 3-row and a 64-row slice against the same
     rows inside T = 2048, bitwise, outputs and per-row gradients (rows alone take the small-T tiers'
     configs: the check that the tiers give the large-T tier's bits);
  5. weight gradients twice at T = 2048, bitwise.

Candidates (`--candidate KERNEL:T:CONFIG`, repeatable): KERNEL one of timestep_mlp's GEMMs (fwd1, fwd2, dh,
dx, dw2, dw1) or adaln_projection's (ada_fwd, ada_dx, ada_dw); CONFIG in `LaunchConfig.short()`'s notation
(`parse_config`: e.g. 128x256x64/w8/s3/P/TMA/TS/g16, 32x16x32/w2/s3/k6/fp16x3/L/S/P2). Each is timed at T
beside the default's config for that GEMM at T (listed first), with its error against float64, whether
its output is bitwise the default's (`bitwise_equal_default`: what a config needs to become a tier of the
default) and, for the row-wise GEMMs, whether one row alone is bitwise that row inside T = 2048.

Writes JSON to --out; prints a short table last. Every section catches its own errors (recorded as
strings), so one failing kernel does not lose the rest of the run.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "--dry-run" in sys.argv:  # on before triton is first imported (below)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import asdict  # noqa: E402
from typing import Callable, Optional  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from h3bench.harness.config import load_config  # noqa: E402
from h3bench.harness.environment import measure_copy_bandwidth  # noqa: E402
from h3bench.harness.execute import as_bits  # noqa: E402
from h3bench.harness.ops import get_op  # noqa: E402
from h3bench.harness.probes.accuracy_latency import rel_err  # noqa: E402
from h3bench.harness.timing import STREAM, SYNCHRONIZED, median, take  # noqa: E402
from h3bench.kernels import adaln_projection_kernel as AP  # noqa: E402
from h3bench.kernels import gemm  # noqa: E402
from h3bench.kernels import timestep_mlp_kernel as TM  # noqa: E402
from h3bench.kernels.adaln_projection_api import adaln_projection  # noqa: E402
from h3bench.kernels.timestep_mlp_api import timestep_mlp  # noqa: E402
from h3bench.kernels.gemm import LaunchConfig as C  # noqa: E402
from tools.kernel_times import summed_kernel_us  # noqa: E402

ROWS = (1, 3, 4, 8, 64, 256, 2048)
BIG = 2048
DEV = torch.device("cuda")
QUICK = False   # --dry-run: the CPU under the interpreter, the quick configs' widths (checks this script)
START = time.time()
MLP_KERNELS = ("fwd1", "fwd2", "dh", "dx", "dw2", "dw1")
ADA_KERNELS = ("ada_fwd", "ada_dx", "ada_dw")
ROW_WISE = ("fwd1", "fwd2", "dh", "dx", "ada_fwd", "ada_dx")   # a row of the output from that row's inputs


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
    gets a fifth of the reps (the run's time budget)."""
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
    except Exception as exc:  # recorded, never fatal: one GPU run has to bring back everything it can
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


OURS = {"timestep_mlp": timestep_mlp, "adaln_projection": adaln_projection}


def leaves_of(inputs, names):
    return [inputs.tensors[n].detach().requires_grad_() for n in names]


def op_section(op_name: str, args) -> dict:
    op = get_op(op_name)
    params = params_of(op_name)
    names = op.input_names
    result = {"rows": {}}
    for rows in args.rows:
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


# --- config candidates ---------------------------------------------------------------------------------

_FLAGS = {"P": "persistent", "KM": "k_major", "L": "local_scales", "S": "swap_ab", "P2": "pair_steps",
          "TMA": "tma", "TS": "tma_store"}


def parse_config(text: str) -> C:
    """A LaunchConfig from `LaunchConfig.short()`'s notation: BMxBNxBK, then /wN (warps), /sN (stages),
    /kN (split_k), /gN (group_m), a precision (tf32x3, fp64, fp16x3) and flags (P, KM, L, S, P2, TMA, TS)."""
    head, *parts = text.strip().split("/")
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", head)
    if not m:
        raise ValueError(f"a config starts with BLOCK_MxBLOCK_NxBLOCK_K, got {text!r}")
    fields: dict = {}
    numbers = {"w": "num_warps", "s": "num_stages", "k": "split_k", "g": "group_m"}
    for part in parts:
        n = re.fullmatch(r"([wskg])(\d+)", part)
        if n:
            fields[numbers[n.group(1)]] = int(n.group(2))
        elif part in gemm.PRECISIONS:
            fields["precision"] = part
        elif part in _FLAGS:
            fields[_FLAGS[part]] = True
        else:
            raise ValueError(f"unknown part {part!r} of config {text!r} (wN sN kN gN, {', '.join(gemm.PRECISIONS)}, "
                             f"{', '.join(_FLAGS)})")
    return C(int(m.group(1)), int(m.group(2)), int(m.group(3)), **fields)


def parse_candidate(text: str) -> tuple[str, int, C]:
    """KERNEL:T:CONFIG -> (kernel, T, LaunchConfig)."""
    try:
        kernel, rows, config = text.split(":")
        rows = int(rows)
    except ValueError:
        raise ValueError(f"a candidate is KERNEL:T:CONFIG, got {text!r}") from None
    if kernel not in MLP_KERNELS + ADA_KERNELS:
        raise ValueError(f"unknown kernel {kernel!r} (one of {', '.join(MLP_KERNELS + ADA_KERNELS)})")
    if rows < 1:
        raise ValueError(f"a candidate's T must be >= 1, got {rows}")
    return kernel, rows, parse_config(config)


def default_config(kernel: str, rows: int) -> C:
    """The config the op's current config set launches for this GEMM at `rows` rows."""
    if kernel in ADA_KERNELS:
        return gemm.pick(getattr(AP.configs(), kernel[4:]), rows)
    return gemm.pick(getattr(TM.configs(), kernel), rows)


def mlp_tensors(rows: int) -> dict:
    op = get_op("timestep_mlp")
    params = params_of("timestep_mlp")
    t = dict(op.make_inputs(params, rows, 11, DEV).tensors)
    g = torch.Generator(device=DEV).manual_seed(7)
    t["h"] = torch.randn(rows, params.hidden, generator=g, device=DEV)
    t["z"] = torch.randn(rows, params.hidden, generator=g, device=DEV)
    t["dy"] = torch.randn(rows, params.temb_dim, generator=g, device=DEV)
    return t


def ada_tensors(rows: int) -> dict:
    op = get_op("adaln_projection")
    params = params_of("adaln_projection")
    p = op.parameters(params, DEV)
    g = torch.Generator(device=DEV).manual_seed(7)
    temb = torch.randn(rows, params.temb_dim, generator=g, device=DEV)
    dy = torch.randn(rows, params.out_features, generator=g, device=DEV).to(p["w"].dtype)
    return {"w": p["w"], "b": p["b"], "temb": temb, "dy": dy, "a": gemm.silu_cast(temb, p["w"].dtype, ones_column=True)}


def kernel_call(kernel: str, cfg: C, t: dict, rows: Optional[int] = None) -> Callable[[], tuple]:
    """The GEMM as its op launches it, on `t` (its first `rows` rows for the row-wise GEMMs): its outputs."""
    def first(name):
        return t[name] if rows is None else t[name][:rows]
    f32 = torch.float32
    if kernel in ADA_KERNELS:
        w, b, dtype = t["w"], t["b"], t["w"].dtype
        return {
            "ada_fwd": lambda: (gemm.forward(first("a"), w, b, cfg, out_dtype=dtype)[0],),
            "ada_dx": lambda: (gemm.input_grad(first("dy"), w, cfg, dsilu_of=first("temb")),),
            "ada_dw": lambda: gemm.weight_grad(t["dy"], t["a"], cfg, a_ones="stored", dw_dtype=dtype, db_dtype=dtype),
        }[kernel]
    return {
        "fwd1": lambda: gemm.forward(first("x"), t["w1"], t["b1"], cfg, out_dtype=f32, out_silu=True, save_pre=True),
        "fwd2": lambda: (gemm.forward(first("h"), t["w2"], t["b2"], cfg, out_dtype=f32)[0],),
        "dh": lambda: (gemm.input_grad(first("dy"), t["w2"], cfg, dsilu_of=first("z")),),
        "dx": lambda: (gemm.input_grad(first("z"), t["w1"], cfg),),
        "dw2": lambda: (gemm.weight_grad(t["dy"], t["h"], cfg, dw_dtype=f32, db_dtype=None)[0],),
        "dw1": lambda: (gemm.weight_grad(t["z"], t["x"], cfg, dw_dtype=f32, db_dtype=None)[0],),
    }[kernel]


def kernel_reference(kernel: str, t: dict) -> torch.Tensor:
    """The float64 value of `kernel_call(kernel, ...)`'s first output."""
    d = {k: v.double() for k, v in t.items()}
    if kernel in ADA_KERNELS:
        a = d["a"][:, :d["temb"].shape[1]]
        s = torch.sigmoid(d["temb"])
        return {"ada_fwd": lambda: a @ d["w"].t() + d["b"],
                "ada_dx": lambda: (d["dy"] @ d["w"]) * (s * (1 + d["temb"] * (1 - s))),
                "ada_dw": lambda: d["dy"].t() @ a}[kernel]()
    s = torch.sigmoid(d["z"])
    return {"fwd1": lambda: F.silu(d["x"] @ d["w1"].t() + d["b1"]), "fwd2": lambda: d["h"] @ d["w2"].t() + d["b2"],
            "dh": lambda: (d["dy"] @ d["w2"]) * (s * (1 + d["z"] * (1 - s))), "dx": lambda: d["z"] @ d["w1"],
            "dw2": lambda: d["dy"].t() @ d["h"], "dw1": lambda: d["z"].t() @ d["x"]}[kernel]()


def same_bits(xs, ys) -> bool:
    return all(torch.equal(as_bits(x), as_bits(y)) for x, y in zip(xs, ys))


def candidates_section(args) -> list:
    """Each (kernel, T) group of --candidate: the default's config at T first, then the candidates."""
    groups: dict = {}
    for kernel, rows, cfg in args.candidates:
        groups.setdefault((kernel, min(rows, BIG)), []).append(cfg)
    out = []
    for (kernel, rows), cands in groups.items():
        tensors = ada_tensors if kernel in ADA_KERNELS else mlp_tensors
        t = tensors(rows)
        big = tensors(BIG) if kernel in ROW_WISE else None
        exact = kernel_reference(kernel, t)
        reference = None
        for i, cfg in enumerate([default_config(kernel, rows)] + cands):
            rec = {"kernel": kernel, "rows": rows, "config": cfg.short(), "default": i == 0, **asdict(cfg)}
            out.append(rec)
            if elapsed() > args.budget:
                rec["skipped"] = "time budget"
                continue
            try:
                call = kernel_call(kernel, cfg, t)
                outputs = call()
                if i == 0:
                    reference = outputs
                else:
                    rec["bitwise_equal_default"] = same_bits(outputs, reference)
                rec["err"] = rel_err(outputs[0], exact)
                if big is not None:   # one row alone against the same row inside T = BIG
                    whole = kernel_call(kernel, cfg, big)()
                    alone = kernel_call(kernel, cfg, big, rows=1)()
                    rec["row_alone_equal"] = same_bits([x[:1] for x in whole], alone)
                    del whole, alone
                del outputs
                rec["us"] = timed(call, args.warmup, args.reps)
                if rows <= 64 and DEV.type == "cuda":   # small T: the host paces the stream; the kernels' own time
                    rec["kernel_us"] = summed_kernel_us(call, args.reps)
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        del t, big, reference
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
    return out


# --- report --------------------------------------------------------------------------------------------

def table(report: dict) -> str:
    lines = []
    for op_name in ("timestep_mlp", "adaln_projection"):
        sec = report.get(op_name)
        if sec is None:
            continue
        if "error" in sec:
            lines.append(f"== {op_name}: ERROR {sec['error']}")
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
        lines.append(f"   invariance (rows alone / slices vs T={BIG}, bitwise): {inv.get('all_equal', inv)}")
        lines.append(f"   weight grads repeat: {sec.get('repeat')}")
    found = report.get("candidates", [])
    if isinstance(found, dict):   # the whole section failed: `guard` kept its error
        lines.append(f"== candidates: ERROR {found.get('error')}")
        found = []
    if found:
        lines.append("== candidates (best stream us; * = the default's config at that T)")
    for rec in found:
        mark = "*" if rec.get("default") else " "
        if "us" in rec:
            t = f"T{rec['rows']}:{best(rec['us']):.1f}"
            if "kernel_us" in rec:
                t += f" (kernels {rec['kernel_us']:.1f})"
        else:
            t = rec.get("error") or rec.get("skipped", "")
        check = " ".join(f"{name} {rec[key]}" for key, name in (("row_alone_equal", "alone"),
                                                                 ("bitwise_equal_default", "=default")) if key in rec)
        err = f"err {rec['err']:.2e}" if "err" in rec else ""
        lines.append(f" {mark} {rec['kernel']:7s} {rec['config']:36s} {t}  {err}  {check}")
    lines.append(f"total {elapsed():.0f} s")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--budget", type=float, default=200.0, help="seconds after which candidates are skipped")
    parser.add_argument("--ops", default="timestep_mlp,adaln_projection", help="the ops' sections to run")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="T of the ops' sections")
    parser.add_argument("--skip-ops", action="store_true", help="no op sections: the candidates only")
    parser.add_argument("--candidate", action="append", default=[], metavar="KERNEL:T:CONFIG",
                        help="a config to time against the default's at T (repeatable; module docstring)")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, TRITON_INTERPRET=1 and the quick widths: checks this script, measures nothing")
    args = parser.parse_args(argv)
    args.ops = [op for op in args.ops.split(",") if op]
    unknown = set(args.ops) - set(OURS)
    if unknown:
        parser.error(f"--ops: unknown {', '.join(sorted(unknown))} (timestep_mlp, adaln_projection)")
    try:
        args.rows = [int(r) for r in args.rows.split(",") if r]
        args.candidates = [parse_candidate(text) for text in args.candidate]
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    global DEV, QUICK, BIG
    if args.dry_run:
        if not gemm.INTERPRETED:
            raise SystemExit("--dry-run runs under the interpreter: set TRITON_INTERPRET=1 before python starts "
                             "(python -m tools.bench_gemm --dry-run does)")
        DEV, QUICK, BIG = torch.device("cpu"), True, 40
        args.rows = sorted({min(r, BIG) for r in args.rows})
        args.warmup, args.reps = 1, 2
    elif not torch.cuda.is_available():
        raise SystemExit("tools.bench_gemm times on a CUDA GPU (--dry-run checks the script on the CPU)")
    tf32_off()
    torch.manual_seed(0)
    report: dict = {"device": torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu (dry run)",
                    "torch": torch.__version__, "dry_run": args.dry_run}
    import triton
    report["triton"] = triton.__version__
    args.copy_gbps = measure_copy_bandwidth(DEV)[0]
    report["copy_gbps"] = round(args.copy_gbps, 1)
    report["defaults"] = {"timestep_mlp": repr(TM.configs()), "adaln_projection": repr(AP.configs())}
    for op_name in () if args.skip_ops else args.ops:
        guard(report, op_name, lambda: op_section(op_name, args))
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
    if args.candidates:
        guard(report, "candidates", lambda: candidates_section(args))
    report["seconds"] = round(elapsed(), 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(table(report))
    return report


if __name__ == "__main__":
    main()
