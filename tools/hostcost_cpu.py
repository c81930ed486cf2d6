"""Host cost of norm_modulate / final_adaln_out calls on a CPU-only machine, every Triton launch a no-op.

    TRITON_INTERPRET=1 python -m tools.hostcost_cpu [--op norm_modulate|final_adaln_out] [--rows 8]
        [--hidden 64] [--table-rows 9] [--dtype bf16,fp32] [--calls 200] [--blocks 25] [--profile]
        [--check-index] [--json FILE]

(TRITON_INTERPRET=1 is set here if unset, before triton is imported: the kernels' modules import on a
machine without a GPU only under the interpreter.)

What it measures: the Python and torch host path of a call, the part that on the lent H200 VM costs
tens of microseconds per operation and makes small and medium sizes host-bound. Every launch the
launchers make (every `kernels.common.launch*`: `launch`, `launch_ready`, `launch_keyed`,
wherever a kernels module bound them) is replaced by a no-op; allocations, views, checks, recipe lookups, the autograd Function and
every torch call stay real. Each case is timed as the best of `--blocks` blocks of `--calls` calls
(time.perf_counter around the block, the garbage collector off as in timeit), in microseconds per call:

* fwd: the call with x, w, sh, sc (final_adaln_out: x, nw, temb, w, b) requiring grad (an autograd
  node is made, rstd saved), output dropped.
* fwd+bwd: the same, then `.backward(dy)`, the leaves' .grad reset to None before each call (as the
  harness's fwd_bwd_net step).
* fwd (no grad): an inference call under torch.no_grad().

`--op final_adaln_out` times kernels.final_adaln_out_api.final_adaln_out. `--profile` adds a cProfile of the
fwd+bwd loop per case (top functions by own time and by cumulative time). Calls pass check_index=False (the harness does), unless --check-index.

Differences from the GPU: no launch cost at all (on the H200 a fast launch, binder + compiled.run, is
~10 us of host each), no CUDA caching allocator (CPU allocations instead), and CPU tensors take the
same branches as CUDA ones except the device checks (the current-device test is skipped for CPU
tensors). The H200 VM's host has measured ~2-3x this machine's per operation.
"""
from __future__ import annotations

import os

if __name__ == "__main__":  # as a program only: imported (by the tests), it leaves the process's switch alone
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import gc  # noqa: E402
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


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_()


def _steps(call: Callable[[], torch.Tensor], leaves: tuple, dy: torch.Tensor) -> dict[str, Callable[[], None]]:
    """The three timed steps of one call: with grad, with its backward (leaves' .grad reset first, as
    the harness's fwd_bwd_net step), and under no_grad."""
    def fwd_bwd():
        for t in leaves:
            t.grad = None
        call().backward(dy)

    def fwd_nograd():
        with torch.no_grad():
            call()
    return {"fwd": call, "fwd+bwd": fwd_bwd, "fwd (no grad)": fwd_nograd}


def norm_modulate_case(rows: int, hidden: int, table_rows: int, dtype: torch.dtype, check_index: bool
                       ) -> dict[str, Callable[[], None]]:
    """The harness's layout: sh and sc are the column halves of one [M, 2H] AdaLN table (row-strided views)."""
    from h3bench.kernels.norm_modulate_api import norm_modulate
    g = torch.Generator().manual_seed(0)
    x = _leaf(2 * torch.randn(rows, hidden, generator=g).to(dtype))
    w = _leaf((0.5 + torch.rand(hidden, generator=g)).to(dtype))
    table = (0.1 * torch.randn(table_rows, 2 * hidden, generator=g)).to(dtype)
    sh, sc = (_leaf(t) for t in table.chunk(2, dim=1))
    idx = torch.randint(0, table_rows, (rows,), generator=g)
    dy = torch.randn(rows, hidden, generator=g).to(dtype)
    return _steps(lambda: norm_modulate(x, w, sh, sc, idx, check_index=check_index), (x, w, sh, sc), dy)


def final_adaln_out_case(rows: int, hidden: int, table_rows: int, dtype: torch.dtype, check_index: bool,
                         temb_dim: int = 64) -> dict[str, Callable[[], None]]:
    from h3bench.kernels.final_adaln_out_api import final_adaln_out
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


def timestep_mlp_case(rows: int, hidden: int, freq_dim: int = 16, temb_dim: int = 24
                      ) -> dict[str, Callable[[], None]]:
    """fp32 throughout, with the GPU's config set (kernels.timestep_mlp_kernel.DEFAULT: fp16x3 GEMM2, split-K),
    not the interpreter's: the host path a CUDA call takes (the launches are stubbed, nothing runs)."""
    from h3bench.kernels import timestep_mlp_kernel as TM
    from h3bench.kernels.timestep_mlp_api import timestep_mlp
    TM.configs = lambda: TM._CONFIGS[0]
    g = torch.Generator().manual_seed(0)
    x = _leaf(torch.randn(rows, freq_dim, generator=g))
    w1 = _leaf(0.1 * torch.randn(hidden, freq_dim, generator=g))
    b1 = _leaf(0.1 * torch.randn(hidden, generator=g))
    w2 = _leaf(0.1 * torch.randn(temb_dim, hidden, generator=g))
    b2 = _leaf(0.1 * torch.randn(temb_dim, generator=g))
    dy = torch.randn(rows, temb_dim, generator=g)
    return _steps(lambda: timestep_mlp(x, w1, b1, w2, b2), (x, w1, b1, w2, b2), dy)


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


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=("norm_modulate", "final_adaln_out", "timestep_mlp"), default="norm_modulate")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--table-rows", type=int, default=9)
    ap.add_argument("--dtype", default="bf16,fp32", help="comma-separated: bf16, fp16, fp32")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=25)
    ap.add_argument("--check-index", action="store_true", help="calls with check_index=True (default False)")
    ap.add_argument("--profile", action="store_true", help="cProfile the fwd+bwd loop of each case")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    import h3bench.kernels.final_adaln_out_api  # noqa: F401  (every launcher's module, so stub_launches sees them)
    import h3bench.kernels.norm_modulate_api  # noqa: F401
    import h3bench.kernels.timestep_mlp_api  # noqa: F401
    restore = stub_launches()
    try:
        cases = []
        for name in args.dtype.split(","):
            dtype = DTYPES[name.strip()]
            if args.op == "timestep_mlp":
                if dtype == torch.float32:   # fp32 only (the op's contract)
                    cases.append(("timestep_mlp fp32", timestep_mlp_case(args.rows, args.hidden)))
            elif args.op == "norm_modulate":
                cases.append((f"norm_modulate {name}", norm_modulate_case(
                    args.rows, args.hidden, args.table_rows, dtype, args.check_index)))
            else:
                cases.append((f"final_adaln_out {name}", final_adaln_out_case(
                    args.rows, args.hidden, args.table_rows, dtype, args.check_index)))
        results = {}
        for label, steps in cases:
            results[label] = {step: best_us(fn, args.calls, args.blocks) for step, fn in steps.items()}
            print(f"{label:40s} " + "  ".join(f"{k} {v:8.2f} us" for k, v in results[label].items()), flush=True)
            if args.profile:
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
