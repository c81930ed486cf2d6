"""Where the host time of a norm_modulate forward+backward goes (GPU only; not used by the op).

    python -m tools.hostcost --out DIR [--rows 32768] [--hidden 5376] [--table-rows 9]

Where a launch costs tens of microseconds of host time, a forward+backward of a few launches can be
host-bound: the GPU idles between kernels and CUDA-event timings measure the host.
This prints the host cost of each primitive (tiny tensors, so the GPU never holds the host back),
then, at the real size, the host time per iteration next to the GPU time per iteration, and a
kernel timeline of one iteration (torch.profiler), so the gaps between kernels are visible.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl

from h3bench.harness.timing import STREAM, SYNCHRONIZED, median, take
from h3bench.kernels import norm_modulate_kernel as K
from h3bench.kernels.norm_modulate_api import norm_modulate
from tools.sweep_norm_modulate import make_case

HIDDEN = 5376
TABLE_ROWS = 9


@triton.jit
def _noop(P):
    tl.store(P, 1.0)


def host_us(fn, reps: int = 300) -> float:
    """Host wall time per call, the GPU idle-free (tiny work): the cost of Python, torch and launches."""
    from tools.kernel_times import queued_us
    return round(queued_us(fn, reps, warmup=20)[0], 2)


def _leaves(t):
    return [t[n].detach().requires_grad_() for n in ("x", "w", "sh", "sc")]


def primitives(dev) -> dict[str, float]:
    _, t = make_case(dev, HIDDEN, 8, TABLE_ROWS)
    x, w, sh, sc, idx = (t[n] for n in ("x", "w", "sh", "sc", "idx"))
    small = torch.empty(8, device=dev)
    res = {}
    res["torch.empty [8, H] bf16"] = host_us(lambda: torch.empty((8, HIDDEN), dtype=torch.bfloat16, device=dev))
    res["torch.empty_like(x)"] = host_us(lambda: torch.empty_like(x))
    res["x.new_empty((8,), fp32)"] = host_us(lambda: x.new_empty((8,), dtype=torch.float32))
    res["x.view(8, H)"] = host_us(lambda: x.view(8, HIDDEN))
    res["x[0] (select)"] = host_us(lambda: x[0])
    res["small[2:4] (slice)"] = host_us(lambda: small[2:4])
    res["x.stride(0)"] = host_us(lambda: x.stride(0))
    res["10 attribute reads (dtype, device, shape)"] = host_us(
        lambda: (x.dtype, x.device, x.shape, w.dtype, w.device, w.shape, sh.dtype, sh.shape, idx.dtype, idx.shape))
    res["torch.add tiny (one launch)"] = host_us(lambda: torch.add(small, 1))
    res["triton _noop launch"] = host_us(lambda: _noop[(1,)](small))
    compiled = _noop[(1,)](small)
    stream = torch.cuda.current_stream().cuda_stream
    res["triton _noop compiled.run direct"] = host_us(
        lambda: compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, small))
    binder = _noop.device_caches[torch.cuda.current_device()][4]
    res["triton _noop binder only"] = host_us(lambda: binder(small))
    res["torch.cuda.current_device + stream"] = host_us(
        lambda: torch.cuda.current_stream(torch.cuda.current_device()))
    from h3bench.kernels import norm_modulate_api as api
    y, rstd = K.forward(x, w, sh, sc, idx, 1e-5)
    res["K.forward (1 launch, 2 allocations)"] = host_us(lambda: K.forward(x, w, sh, sc, idx, 1e-5))
    res["K.forward no rstd (1 launch, 1 allocation)"] = host_us(
        lambda: K.forward(x, w, sh, sc, idx, 1e-5, save_rstd=False))
    res["api norm_modulate no grad"] = host_us(lambda: norm_modulate(x, w, sh, sc, idx, check_index=False))
    res["api _fast_ok only"] = host_us(lambda: api._fast_ok(x, w, sh, sc, idx))
    res["api _check only (detailed checks)"] = host_us(lambda: api._check(x, w, sh, sc, idx))
    dy = torch.ones_like(x)
    res["K.backward (2 launches)"] = host_us(lambda: K.backward(dy, x, w, sc, idx, rstd, sh.shape[0], sh.dtype, True))
    res["K.backward dx only (1 launch)"] = host_us(
        lambda: K.backward(dy, x, w, sc, idx, rstd, sh.shape[0], sh.dtype, False))
    case = _FwdBwdCase(dev, 8)
    res["ours fwd+bwd (autograd)"] = host_us(case.step)

    def rms():
        case.clear()
        case.torch_rms_norm()
    res["torch F.rms_norm fwd+bwd (autograd)"] = host_us(rms)

    class Ident(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.view(a.shape)

        @staticmethod
        def backward(ctx, g):
            return g
    leaf = x.detach().requires_grad_()

    def ident():
        leaf.grad = None
        Ident.apply(leaf).backward(dy)
    res["autograd.Function identity fwd+bwd"] = host_us(ident)
    return res


class _FwdBwdCase:
    """The harness's fwd_bwd_net step on prior-art inputs: fresh leaves, a fixed upstream gradient."""

    def __init__(self, dev, rows: int):
        _, t = make_case(dev, HIDDEN, rows, TABLE_ROWS)
        self.idx = t["idx"]
        self.leaves = _leaves(t)
        self.ones = torch.ones_like(t["x"])

    def clear(self) -> None:
        for leaf in self.leaves:
            leaf.grad = None

    def ours(self):
        norm_modulate(*self.leaves, self.idx, check_index=False).backward(self.ones)

    def torch_rms_norm(self):
        torch.nn.functional.rms_norm(self.leaves[0], (HIDDEN,), self.leaves[1], 1e-5).backward(self.ones)

    def step(self):
        self.clear()
        self.ours()


def iteration(dev, rows: int) -> dict[str, float]:
    """At the real size: host time per fwd+bwd iteration (no sync) against CUDA-event time."""
    case = _FwdBwdCase(dev, rows)
    res = {}
    for name, fn in (("ours", case.ours), ("torch_rms_norm", case.torch_rms_norm)):
        def step():
            case.clear()
            fn()
        res[f"{name} host us/iter"] = host_us(step, reps=100)
        for method in (SYNCHRONIZED, STREAM):
            res[f"{name} event us ({method})"] = [round(median(take(fn, dev, method, 50, case.clear)), 1)
                                                  for _ in range(2)]
    return res


def timeline(dev, rows: int) -> list[str]:
    case = _FwdBwdCase(dev, rows)
    for _ in range(5):
        case.step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            case.step()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    t0 = events[0].time_range.start if events else 0
    lines = [f"{e.time_range.start - t0:9.1f} +{e.time_range.end - e.time_range.start:7.1f} us  {e.name[:70]}"
             for e in events]
    lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    return lines


def sinusoid_pieces(dev) -> dict[str, float]:
    """Host us per call of the timestep_sinusoid row and of each piece of its path, next to SGLang's row
    (when it loads): the op moves at most 2 MB, so its per-sample latency is this host path."""
    from h3bench.kernels import timestep_sinusoid_api as S
    from h3bench.kernels import timestep_sinusoid_kernel as SK
    from h3bench.kernels.common import fast_launch_allowed, launch, launch_ready, ready_runner, runner

    t = torch.zeros(1, dtype=torch.float32, device=dev)
    out = S.timestep_sinusoid(t)
    freqs = SK.frequencies(dev, 128, 10000, 0.0)
    cfg = SK.config_for(256, False)
    kernel, grid = SK._sinusoid_kernel, (1,)
    meta = dict(HALF=128, BLOCK_K=128, ROWS=cfg.rows, INTERPRETED=False, num_warps=cfg.warps)
    meta_items, index = tuple(meta.items()), torch.cuda.current_device()  # made once, as the op keeps them
    res = {"whole call (T=1)": host_us(lambda: S.timestep_sinusoid(t)),
           "_check": host_us(lambda: S._check(t, 256, 10000, 0.0)),
           "torch.empty [1, 256] fp32": host_us(lambda: torch.empty((1, 256), dtype=torch.float32, device=dev)),
           "torch.cuda.current_device": host_us(torch.cuda.current_device),
           "kernels.common.launch": host_us(lambda: launch(kernel, grid, t, freqs, out, 1, 1, **meta)),
           "kernel[grid] (triton's path)": host_us(lambda: kernel[grid](t, freqs, out, 1, 1, **meta)),
           "kernels.common.launch_ready": host_us(lambda: launch_ready(kernel, grid, index, t.dtype,
                                                                     (t, freqs, out, 1, 1), meta_items))}
    binder = kernel.device_caches[torch.cuda.current_device()][4]
    res["binder only"] = host_us(lambda: binder(t, freqs, out, 1, 1, **meta))
    compiled = kernel[grid](t, freqs, out, 1, 1, **meta)
    bound = binder(t, freqs, out, 1, 1, **meta)[0]
    stream = torch.cuda.current_stream().cuda_stream
    res["compiled.run only"] = host_us(lambda: compiled.run(1, 1, 1, stream, compiled.function,
                                                           compiled.packed_metadata, None, None, None,
                                                           *bound.values()))
    run, head = runner(compiled)
    values = tuple(bound.values())
    res[f"runner: {getattr(run, '__qualname__', type(run).__name__)}"] = host_us(
        lambda: run(1, 1, 1, stream, *head, *values))
    # the C launcher reads a tensor's data_ptr() and asks the driver whether it is device memory
    # (cuPointerGetAttribute); an int pointer skips both
    ints = tuple(v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values)
    res["runner, int pointers"] = host_us(lambda: run(1, 1, 1, stream, *head, *ints))
    res["t.new_empty(1, 256, fp32)"] = host_us(lambda: t.new_empty(1, 256, dtype=torch.float32))
    res["torch._C._cuda_getDevice"] = host_us(torch._C._cuda_getDevice)
    res["torch._C._cuda_getCurrentRawStream"] = host_us(lambda: torch._C._cuda_getCurrentRawStream(index))
    res["fast_launch_allowed"] = host_us(fast_launch_allowed)
    ready = ready_runner(kernel, index, t.dtype, meta_items)  # the entry launch_ready made above
    if ready is None:
        res["least: new_empty + stream + int-pointer run"] = "no launch_ready entry (this triton's path)"
    else:
        ready_run, ready_head, ready_tail = ready
        fp = freqs.data_ptr()

        def least():  # what any call must do: allocate the output, read the stream, launch with int pointers
            o = t.new_empty(1, 256, dtype=torch.float32)
            ready_run(1, 1, 1, torch._C._cuda_getCurrentRawStream(index), *ready_head, t.data_ptr(), fp,
                      o.data_ptr(), 1, 1, *ready_tail)
            return o
        res["least: new_empty + stream + int-pointer run"] = host_us(least)
    for direct in (False, True, False, True):
        set_direct(direct)
        res.setdefault(f"whole call (T=1), direct {'on' if direct else 'off'}", []).append(
            host_us(lambda: S.timestep_sinusoid(t)))
    try:
        from h3bench.adapters.timestep_sinusoid.sglang import ADAPTER
        from h3bench.harness.ops.timestep_sinusoid import TimestepSinusoidParams

        loaded = ADAPTER.try_load(dev, TimestepSinusoidParams(256, 10000, 0.0))
        res["sglang row (T=1)"] = host_us(lambda: loaded.fn(t)) if not isinstance(loaded, str) else loaded
    except Exception as exc:  # a diagnostic: say why, go on
        res["sglang row (T=1)"] = f"{type(exc).__name__}: {exc}"
    return res


# Our rows whose launches go through `kernels.common.launch_keyed`, with the row counts timed (the GEMM ops'
# small-T forward targets; norm_modulate's host figures at R = 8 and 4097 (kernels/notes/norm_modulate.md,
# "Host path"), final_adaln_out likewise).
KEYED_SIZES = {"adaln_projection": (1, 4), "timestep_mlp": (1, 4), "norm_modulate": (8, 4097),
               "final_adaln_out": (8, 4097)}


def set_direct(direct: bool) -> None:
    """`kernels.common.runner` calling the C launcher itself (True) or through `CudaLauncher.__call__`; the
    launch caches emptied, so the next launches remember runners made under this setting."""
    from h3bench.kernels import common
    from h3bench.kernels import timestep_sinusoid_api as S
    common.DIRECT = direct
    for cache in (common._COMPILED, common._READY, common._KEYED):
        cache.clear()
    for recipe in S._RECIPES.values():  # the sinusoid's kept entries, made from those caches
        recipe[3].clear()


def set_keyed(keyed: bool) -> None:
    """`kernels.common.launch_keyed` by the caller's key (True) or through triton's binder every launch."""
    from h3bench.kernels import common
    common.KEYED = keyed


# what `keyed_pieces` switches: name -> (the setting's on / off tags, how to set it)
SWITCHES = {"keyed": (("keyed", "binder"), set_keyed), "direct": (("direct", "call"), set_direct)}


def keyed_pieces(dev, ops, switch: str = "keyed") -> dict[str, float]:
    """Host us per call of our row's forward (no grad) and fwd+bwd (each op's first size; norm_modulate's
    both) with the `switch` on and off, interleaved: "keyed", `kernels.common.launch_keyed` reusing
    compiled kernels by the caller's key against triton's binder on every launch; "direct", the C launcher
    called by `kernels.common.runner` against `CudaLauncher.__call__`; and, with adaln_projection, the
    pieces of its forward."""
    from h3bench.harness.ops import get_op
    from h3bench.harness.config import load_config
    from h3bench.adapters import builtin_adapters
    from h3bench.kernels import common

    res = {}
    cases = {}
    for name in ops:
        op, params = get_op(name), load_config(name).inputs
        (row,) = [a for a in builtin_adapters(name) if a.name == "h3bench_triton"]
        fn = row.load(dev, params).fn
        for rows in KEYED_SIZES[name]:
            inputs = op.make_inputs(params, rows, 3, dev)
            cases[(name, rows)] = (fn, [inputs.tensors[n] for n in op.input_names], op, params, inputs)
    tags, setting = SWITCHES[switch]
    for on in (True, False, True, False):
        setting(on)
        tag = tags[0] if on else tags[1]
        for (name, rows), (fn, values, op, params, inputs) in cases.items():
            def fwd():
                with torch.no_grad():
                    fn(*values)
            res.setdefault(f"{name} fwd R={rows} {tag}", []).append(host_us(fwd, reps=200))
            if rows == KEYED_SIZES[name][0] or name == "norm_modulate":
                fwd_bwd = _fwd_bwd_step(fn, op, params, inputs, rows, dev)
                res.setdefault(f"{name} fwd+bwd R={rows} {tag}", []).append(host_us(fwd_bwd, reps=100))
    setting(True)
    if "adaln_projection" in ops:
        res.update(_adaln_pieces(dev, *cases[("adaln_projection", 1)][1]))
    return res


def _fwd_bwd_step(fn, op, params, inputs, rows: int, dev):
    """One fwd+bwd of `fn` on `inputs` as a closure: the differentiable inputs as leaves, the gradients by
    torch.autograd.grad against a fixed upstream gradient (nothing accumulates between calls)."""
    leaves = [inputs.tensors[n].detach().requires_grad_() if n in op.differentiable else inputs.tensors[n]
              for n in op.input_names]
    (dy,) = op.make_grad_outs(params, rows, 5, dev)
    wrt = [v for n, v in zip(op.input_names, leaves) if n in op.differentiable]

    def fwd_bwd():
        torch.autograd.grad(fn(*leaves), wrt, dy)
    return fwd_bwd


def profile_rows(dev, ops, steps: int = 30) -> list[str]:
    """Where our row's host time goes in a fwd+bwd (each op's first `KEYED_SIZES` size): torch.profiler's
    table of the host-side events by self CPU time over `steps` steps (the aten ops, the CUDA runtime calls,
    the autograd engine), and the host us per step without the profiler, for scale."""
    from h3bench.harness.ops import get_op
    from h3bench.harness.config import load_config
    from h3bench.adapters import builtin_adapters

    lines = []
    for name in ops:
        op, params = get_op(name), load_config(name).inputs
        (row,) = [a for a in builtin_adapters(name) if a.name == "h3bench_triton"]
        fn, rows = row.load(dev, params).fn, KEYED_SIZES[name][0]
        fwd_bwd = _fwd_bwd_step(fn, op, params, op.make_inputs(params, rows, 3, dev), rows, dev)
        lines.append(f"== {name} R={rows}: fwd+bwd host us/step without the profiler: {host_us(fwd_bwd, reps=100)}")
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                fwd_bwd()
            torch.cuda.synchronize()
        lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    return lines


def _adaln_pieces(dev, temb, w, b) -> dict[str, float]:
    from h3bench.kernels import adaln_projection_api, gemm
    from h3bench.kernels import adaln_projection_kernel as AP
    cfg = AP.configs()
    a = gemm.silu_cast(temb, w.dtype)
    return {"adaln _check": host_us(lambda: adaln_projection_api._check(temb, w, b)),
            "adaln silu_cast": host_us(lambda: gemm.silu_cast(temb, w.dtype)),
            "adaln gemm.forward": host_us(lambda: gemm.forward(a, w, b, gemm.pick(cfg.fwd, temb.shape[0]),
                                                               out_dtype=w.dtype)),
            "torch.empty [1, 96768] bf16": host_us(lambda: torch.empty((1, 96768), dtype=torch.bfloat16, device=dev))}


def main() -> None:
    global HIDDEN, TABLE_ROWS
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--table-rows", type=int, default=TABLE_ROWS)
    ap.add_argument("--out", default=None)
    ap.add_argument("--breakdown-only", action="store_true")
    ap.add_argument("--sinusoid-only", action="store_true", help="only timestep_sinusoid's host path")
    ap.add_argument("--gemm-only", action="store_true", help="only the GEMM ops' host paths, keyed launches on/off")
    ap.add_argument("--keyed-only", default=None, metavar="OPS",
                    help=f"only our rows' host paths, keyed launches on/off, for these ops (comma list of "
                         f"{', '.join(KEYED_SIZES)})")
    ap.add_argument("--switch", choices=sorted(SWITCHES), default="keyed",
                    help="with --keyed-only/--gemm-only: what is switched on and off (keyed launches, or the "
                         "direct C launcher call)")
    ap.add_argument("--profile-rows", default=None, metavar="OPS",
                    help=f"only torch.profiler's host-side table of our rows' fwd+bwd for these ops (comma list "
                         f"of {', '.join(KEYED_SIZES)})")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tools.hostcost measures host time around CUDA launches and needs a CUDA GPU")
    HIDDEN, TABLE_ROWS = args.hidden, args.table_rows
    dev = torch.device("cuda")
    if args.profile_rows:
        print("\n".join(profile_rows(dev, args.profile_rows.split(","))), flush=True)
        return
    if args.gemm_only or args.keyed_only:
        ops = ("adaln_projection", "timestep_mlp") if args.gemm_only else args.keyed_only.split(",")
        unknown = sorted(set(ops) - set(KEYED_SIZES))
        if unknown:
            raise SystemExit(f"--keyed-only: no keyed row for {', '.join(unknown)}; known: {', '.join(KEYED_SIZES)}")
        for key, val in keyed_pieces(dev, ops, args.switch).items():
            print(f"keyed      {key:45s} {val}", flush=True)
        return
    if args.sinusoid_only:
        for key, val in sinusoid_pieces(dev).items():
            print(f"sinusoid   {key:45s} {val}", flush=True)
        return
    report = {"breakdown": breakdown(dev)}
    if not args.breakdown_only:
        report.update(primitives=primitives(dev), iteration=iteration(dev, args.rows))
    for section in report:
        for key, val in report[section].items():
            print(f"{section:10s} {key:45s} {val}", flush=True)
    lines = [] if args.breakdown_only else timeline(dev, args.rows)
    print("\n".join(lines))
    if args.out:
        with open(f"{args.out}/hostcost.json", "w") as handle:
            json.dump(report, handle, indent=1)
        with open(f"{args.out}/timeline.txt", "w") as handle:
            handle.write("\n".join(lines))



def breakdown_pieces() -> list[tuple[object, str, str]]:
    """(owner, attribute, label) of each piece `breakdown` times in place: the names must exist (a
    renamed one fails the CPU test, tests/test_hostcost_cpu.py, not the GPU call)."""
    from h3bench.kernels import common
    from h3bench.kernels import norm_modulate_api as api
    return [(K, "forward", "K.forward"), (K, "backward", "K.backward"),
            (api, "_fast_ok", "api._fast_ok"), (api, "_check", "api._check (detailed, on failure)"),
            (api, "as_rows", "api.as_rows"),
            (K, "launch_keyed", "kernels.common.launch_keyed (all launches)"),
            (common, "_launch_fast", "kernels.common._launch_fast (first launch per key)"),
            (K, "launch_config", "launch_config"), (K, "_fwd_recipe", "K._fwd_recipe"),
            (K, "_bwd_recipe", "K._bwd_recipe"), (K, "make_plan", "K.make_plan (M > local_max)"),
            (torch, "empty", "torch.empty (all)"), (torch, "empty_like", "torch.empty_like (all)"),
            (torch.Tensor, "new_empty", "Tensor.new_empty (all)"),
            (api._NormModulate, "forward", "_NormModulate.forward (body)"),
            (api._NormModulate, "backward", "_NormModulate.backward (body)"),
            (api, "norm_modulate", "api.norm_modulate (whole forward call)"),
            (triton.runtime.jit.JITFunction, "run", "JITFunction.run (slow launches)")]


def breakdown(dev, rows: int = 8, reps: int = 200) -> dict[str, float]:
    """Host us per autograd fwd+bwd spent inside each piece, timed in place by wrapping it."""
    import threading
    from collections import defaultdict

    from h3bench.kernels import norm_modulate_api as api
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)

    def timed(owner, name, label):
        original = getattr(owner, name)

        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t0
                calls[label] += 1
        setattr(owner, name, wrapper)
        return owner, name, original

    patches = [timed(owner, name, label) for owner, name, label in breakdown_pieces()]
    case = _FwdBwdCase(dev, rows)

    def step():
        case.clear()
        y = api.norm_modulate(*case.leaves, case.idx, check_index=False)
        t0 = time.perf_counter()
        y.backward(case.ones)
        spent["y.backward (engine, incl. K.backward)"] += time.perf_counter() - t0
    try:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
        spent.clear()
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        total = time.perf_counter() - t0
        torch.cuda.synchronize()
    finally:
        for owner, name, original in patches:
            setattr(owner, name, original)
    out = {"total": round(total / reps * 1e6, 2), "threads alive": threading.active_count()}
    out.update({k: round(v / reps * 1e6, 2) for k, v in spent.items()})
    out.update({f"calls/iter {k}": calls[k] / (reps + 20) for k in calls})
    return out


if __name__ == "__main__":
    main()
