"""Host cost of our kernels' calls on a CPU-only machine, every Triton launch a no-op.

    TRITON_INTERPRET=1 python -m tools.hostcost_cpu [--op OP] [--rows 8] [--hidden 64] [--table-rows 9]
        [--dtype bf16,fp32] [--calls 200] [--blocks 25] [--profile] [--check-index] [--custom-ops]
        [--json FILE]

OP: norm_modulate (default), final_adaln_out, timestep_mlp, gate_residual, adaln_row_gather,
adaln_projection, timestep_sinusoid. --rows is the op's rows (T for timestep_mlp, adaln_projection and
timestep_sinusoid), --hidden its H (timestep_mlp's hidden width, timestep_sinusoid's freq_dim).

(TRITON_INTERPRET=1 is set here if unset, before triton is imported: the kernels' modules import on a
machine without a GPU only under the interpreter.)

What it measures: the Python and torch host path of a call, the part that on a GPU machine costs tens of
microseconds per operation and makes small and medium sizes host-bound. Every launch the
launchers make (every `kernels.common.launch*`: `launch`, `launch_ready`, `launch_keyed`,
wherever a kernels module bound them) is replaced by a no-op; allocations, views, checks, recipe lookups, the autograd Function and
every torch call stay real. Each case is timed as the best of `--blocks` blocks of `--calls` calls
(time.perf_counter around the block, the garbage collector off as in timeit), in microseconds per call:

* fwd: the call with x, w, sh, sc (final_adaln_out: x, nw, temb, w, b) requiring grad (an autograd
  node is made, rstd saved), output dropped.
* fwd+bwd: the same, then `.backward(dy)`, the leaves' .grad reset to None before each call (as the
  harness's fwd_bwd_net step).
* fwd (no grad): an inference call under torch.no_grad().

(timestep_sinusoid has no gradient: its one step is the call.) `--profile` adds a cProfile of the fwd+bwd
loop per case (top functions by own time and by cumulative time). Calls pass check_index=False (the harness
does), unless --check-index. `--custom-ops` makes every call as a traced graph holds it, through the op's
torch.library custom ops (kernels/custom_ops.py): what making them the only path would cost.

Differences from the GPU: no launch cost at all (a fast launch, binder + compiled.run, costs host time on
the GPU machine: kernels/notes/launch.md), no CUDA caching allocator (CPU allocations instead), and CPU
tensors take the same branches as CUDA ones except the device checks (the current-device test is skipped for
CPU tensors). A GPU machine's host may be slower or faster per operation than this one: compare figures
within one machine.
"""
from __future__ import annotations

import os

if __name__ == "__main__":  # as a program only: imported (by the tests), it leaves the process's switch alone
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402

import torch  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def launchers() -> set:
    """Every launcher kernels.common has (launch, launch_ready, launch_keyed, ...): one missed by
    `stub_launches` lets its kernels run under the interpreter and the figures measure that instead."""
    from h3bench.kernels import common
    return {value for name, value in vars(common).items() if name.startswith("launch") and callable(value)}


def stub_launches() -> Callable[[], None]:
    """Replace every launch function of kernels.common, and each kernels module's binding of one, by a
    no-op. Returns the function that puts them back."""
    def noop(*args, **kwargs):
        return None

    originals = launchers()
    undo = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "h3bench.kernels" or name.startswith("h3bench.kernels.")):
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and value in originals:
                undo.append((module, attr, value))
                setattr(module, attr, noop)

    def restore():
        for module, attr, value in undo:
            setattr(module, attr, value)
    return restore


def best_us(fn: Callable[[], None], calls: int, blocks: int) -> float:
    for _ in range(min(calls, 30)):
        fn()
    best = float("inf")
    enabled = gc.isenabled()
    gc.disable()  # as timeit: a collection inside a block is noise
    try:
        for _ in range(blocks):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, time.perf_counter() - t0)
    finally:
        if enabled:
            gc.enable()
    return round(best / calls * 1e6, 2)


def function(op: str, traced: bool) -> Callable:
    """The op's public function, or with `traced` its call as a traced graph holds it (`_traced`: the custom
    ops, what making them every call's path would cost)."""
    module = importlib.import_module(f"h3bench.kernels.{op}_api")
    return module._traced if traced else getattr(module, op)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_()


def _steps(call: Callable[[], torch.Tensor], leaves: tuple, dy) -> dict[str, Callable[[], None]]:
    """The three timed steps of one call: with grad, with its backward (leaves' .grad reset first, as
    the harness's fwd_bwd_net step), and under no_grad. `dy`: the output's gradient, or a tuple of one per
    output."""
    def fwd_bwd():
        for t in leaves:
            t.grad = None
        torch.autograd.backward(call(), dy)

    def fwd_nograd():
        with torch.no_grad():
            call()
    return {"fwd": call, "fwd+bwd": fwd_bwd, "fwd (no grad)": fwd_nograd}


def norm_modulate_case(rows: int, hidden: int, table_rows: int, dtype: torch.dtype, check_index: bool,
                       traced: bool = False) -> dict[str, Callable[[], None]]:
    """The harness's layout: sh and sc are the column halves of one [M, 2H] AdaLN table (row-strided views)."""
    norm_modulate = function("norm_modulate", traced)
    g = torch.Generator().manual_seed(0)
    x = _leaf(2 * torch.randn(rows, hidden, generator=g).to(dtype))
    w = _leaf((0.5 + torch.rand(hidden, generator=g)).to(dtype))
    table = (0.1 * torch.randn(table_rows, 2 * hidden, generator=g)).to(dtype)
    sh, sc = (_leaf(t) for t in table.chunk(2, dim=1))
    idx = torch.randint(0, table_rows, (rows,), generator=g)
    dy = torch.randn(rows, hidden, generator=g).to(dtype)
    return _steps(lambda: norm_modulate(x, w, sh, sc, idx, check_index=check_index), (x, w, sh, sc), dy)


def final_adaln_out_case(rows: int, hidden: int, table_rows: int, dtype: torch.dtype, check_index: bool,
                         temb_dim: int = 64, traced: bool = False) -> dict[str, Callable[[], None]]:
    final_adaln_out = function("final_adaln_out", traced)
    g = torch.Generator().manual_seed(0)
    x = _leaf(2 * torch.randn(rows, hidden, generator=g).to(dtype))
    nw = _leaf((0.5 + torch.rand(hidden, generator=g)).to(dtype))
    temb = _leaf(torch.randn(table_rows, temb_dim, generator=g))
    w = _leaf((0.05 * torch.randn(2 * hidden, temb_dim, generator=g)).to(dtype))
    b = _leaf((0.05 * torch.randn(2 * hidden, generator=g)).to(dtype))
    ti = torch.randint(0, table_rows, (rows,), generator=g)
    dy = torch.randn(rows, hidden, generator=g).to(dtype)
    return _steps(lambda: final_adaln_out(x, nw, temb, w, b, ti, check_index=check_index),
                  (x, nw, temb, w, b), dy)


def timestep_mlp_case(rows: int, hidden: int, freq_dim: int = 16, temb_dim: int = 24, traced: bool = False
                      ) -> dict[str, Callable[[], None]]:
    """fp32 throughout, with the GPU's config set (kernels.timestep_mlp_kernel.DEFAULT: fp16x3 GEMM2, split-K),
    not the interpreter's: the host path a CUDA call takes (the launches are stubbed, nothing runs)."""
    from h3bench.kernels import timestep_mlp_kernel as TM
    timestep_mlp = function("timestep_mlp", traced)
    TM.configs = lambda: TM._CONFIGS[0]
    g = torch.Generator().manual_seed(0)
    x = _leaf(torch.randn(rows, freq_dim, generator=g))
    w1 = _leaf(0.1 * torch.randn(hidden, freq_dim, generator=g))
    b1 = _leaf(0.1 * torch.randn(hidden, generator=g))
    w2 = _leaf(0.1 * torch.randn(temb_dim, hidden, generator=g))
    b2 = _leaf(0.1 * torch.randn(temb_dim, generator=g))
    dy = torch.randn(rows, temb_dim, generator=g)
    return _steps(lambda: timestep_mlp(x, w1, b1, w2, b2), (x, w1, b1, w2, b2), dy)


def gate_residual_case(rows: int, hidden: int, table_rows: int, dtype: torch.dtype, check_index: bool,
                       traced: bool = False) -> dict[str, Callable[[], None]]:
    """The harness's layout: gate a column chunk of a [M, 6H] AdaLN table, res and y [R, H]."""
    gate_residual = function("gate_residual", traced)
    g = torch.Generator().manual_seed(0)
    res = _leaf(torch.randn(rows, hidden, generator=g).to(dtype))
    y = _leaf(torch.randn(rows, hidden, generator=g).to(dtype))
    gate = _leaf((0.1 * torch.randn(table_rows, 6 * hidden, generator=g)).to(dtype)[:, 2 * hidden:3 * hidden])
    idx = torch.randint(0, table_rows, (rows,), generator=g)
    dy = torch.randn(rows, hidden, generator=g).to(dtype)
    return _steps(lambda: gate_residual(res, y, gate, idx, check_index=check_index), (res, y, gate), dy)


def adaln_row_gather_case(rows: int, hidden: int, table_rows: int, dtype: torch.dtype, check_index: bool,
                          traced: bool = False) -> dict[str, Callable[[], None]]:
    """The model's 3 modalities and 6 chunks: table [M, 6H] (M rounded down to a multiple of 3, at least 3),
    ti and tag [R]; the backward hands each of the six outputs its own gradient."""
    adaln_row_gather = function("adaln_row_gather", traced)
    g = torch.Generator().manual_seed(0)
    steps = max(1, table_rows // 3)
    table = _leaf((0.1 * torch.randn(steps * 3, 6 * hidden, generator=g)).to(dtype))
    ti = torch.randint(0, steps, (rows,), generator=g)
    tag = torch.randint(0, 3, (rows,), generator=g)
    dys = tuple(torch.randn(rows, hidden, generator=g).to(dtype) for _ in range(6))
    return _steps(lambda: adaln_row_gather(table, ti, tag, check_index=check_index), (table,), dys)


def adaln_projection_case(rows: int, hidden: int, dtype: torch.dtype, temb_dim: int = 64, traced: bool = False
                          ) -> dict[str, Callable[[], None]]:
    """temb [T, D] fp32 (T = --rows), w [6H, D] and b [6H] in `dtype` (bf16 or fp16: the tensor-core GEMM)."""
    adaln_projection = function("adaln_projection", traced)
    g = torch.Generator().manual_seed(0)
    temb = _leaf(torch.randn(rows, temb_dim, generator=g))
    w = _leaf((0.05 * torch.randn(6 * hidden, temb_dim, generator=g)).to(dtype))
    b = _leaf((0.05 * torch.randn(6 * hidden, generator=g)).to(dtype))
    dy = torch.randn(rows, 6 * hidden, generator=g).to(dtype)
    return _steps(lambda: adaln_projection(temb, w, b), (temb, w, b), dy)


def timestep_sinusoid_case(rows: int, freq_dim: int, traced: bool = False) -> dict[str, Callable[[], None]]:
    timestep_sinusoid = function("timestep_sinusoid", traced)
    t = torch.rand(rows, generator=torch.Generator().manual_seed(0)) * 1000
    return {"call": lambda: timestep_sinusoid(t, freq_dim)}


def profile_text(fn: Callable[[], None], calls: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


OPS = ("norm_modulate", "final_adaln_out", "timestep_mlp", "gate_residual", "adaln_row_gather", "adaln_projection",
       "timestep_sinusoid")
# the ops whose case takes rows, hidden, table rows, dtype and check_index
ROW_CASES = {"norm_modulate": norm_modulate_case, "final_adaln_out": final_adaln_out_case,
             "gate_residual": gate_residual_case, "adaln_row_gather": adaln_row_gather_case}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=OPS, default="norm_modulate")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--table-rows", type=int, default=9)
    ap.add_argument("--dtype", default="bf16,fp32", help="comma-separated: bf16, fp16, fp32")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=25)
    ap.add_argument("--check-index", action="store_true", help="calls with check_index=True (default False)")
    ap.add_argument("--profile", action="store_true", help="cProfile the fwd+bwd loop of each case")
    ap.add_argument("--custom-ops", action="store_true",
                    help="every call through the op's torch.library custom ops, as a traced graph makes it")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    for op in OPS:  # every launcher's module, so stub_launches sees them
        importlib.import_module(f"h3bench.kernels.{op}_api")
    restore = stub_launches()
    traced = args.custom_ops
    try:
        cases = []
        for name in args.dtype.split(","):
            dtype = DTYPES[name.strip()]
            if args.op in ("timestep_mlp", "timestep_sinusoid"):
                if dtype == torch.float32:   # fp32 only (timestep_mlp's contract; the sinusoid's output)
                    cases.append((f"{args.op} fp32", timestep_mlp_case(args.rows, args.hidden, traced=traced)
                                  if args.op == "timestep_mlp" else
                                  timestep_sinusoid_case(args.rows, args.hidden, traced=traced)))
            elif args.op == "adaln_projection":
                if dtype != torch.float32:   # w is bf16 or fp16 (the tensor-core GEMM)
                    cases.append((f"adaln_projection {name}",
                                  adaln_projection_case(args.rows, args.hidden, dtype, traced=traced)))
            else:
                cases.append((f"{args.op} {name}", ROW_CASES[args.op](
                    args.rows, args.hidden, args.table_rows, dtype, args.check_index, traced=traced)))
        results = {}
        for label, steps in cases:
            results[label] = {step: best_us(fn, args.calls, args.blocks) for step, fn in steps.items()}
            print(f"{label:40s} " + "  ".join(f"{k} {v:8.2f} us" for k, v in results[label].items()), flush=True)
            if args.profile and "fwd+bwd" in steps:
                print(profile_text(steps["fwd+bwd"], args.calls, args.top))
    finally:
        restore()
    out = {"shape": {"rows": args.rows, "hidden": args.hidden, "table_rows": args.table_rows},
           "calls": args.calls, "blocks": args.blocks, "us_per_call": results}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1)
    return out


if __name__ == "__main__":
    main()
