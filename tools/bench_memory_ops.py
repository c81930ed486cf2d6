"""GPU check, timing and launch-config choice for h3bench's memory-bound Triton ops, in one run.

    python -m tools.bench_memory_ops --out memory_ops.json            (an H200: a few minutes)
    python -m tools.bench_memory_ops --ops gate_residual --sizes 32768 --out gr.json
    TRITON_INTERPRET=1 python -m tools.bench_memory_ops --dry-run --out /tmp/x.json   (CPU: checks the script)

For adaln_row_gather, gate_residual, final_adaln_out and timestep_sinusoid at the model's size and each
row count of its accuracy plan (token ops 4097 and 32768; timestep_sinusoid 1, 3, 4, 64, 256, 2048), and
for each row of the op (our kernel in its default launch configuration, and any alternative under trial
beside it; the torch composition the `diffusers` adapter replays; SGLang's kernel for
timestep_sinusoid when it loads):

  1. errors against the op's float64 reference (output(s) and every gradient, max|err| / max|ref|);
     an alternative's forward bitwise against our default's; parameter gradients twice, bitwise;
  2. forward (no_grad), backward (autograd.backward of a kept graph) and forward+backward (the harness's
     fwd_bwd_net: leaves and upstream gradients made beforehand), CUDA events, median of --reps after
     --warmup, timed twice, each both per-sample synchronized (every sample from an idle GPU: the
     host's cost included, the harness's primary figure) and back to back (`stream`);
  3. each time as a fraction of its floor: the op's `floor_bytes` (forward, forward+backward, and
     their difference for the backward) over the copy bandwidth measured at the start (and again at
     the end, for the spread).

Writes JSON to --out and prints a table per op and size. A row that fails (compile error, wrong result)
is recorded as its error and the others go on. A launch configuration to try goes in as a row of
`variants` beside "default", and comes out again unless its figures win.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from typing import Any, Callable, Optional

import torch

OPS = ("adaln_row_gather", "gate_residual", "final_adaln_out", "timestep_sinusoid")
SEED_INPUT, SEED_GRAD = 11, 9  # the accuracy plan's seeds


# --- arguments ----------------------------------------------------------------------------------------

def _ops(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in OPS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown op(s) {unknown or text!r}; known: {', '.join(OPS)}")
    return list(dict.fromkeys(names))


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes comma-separated row counts, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"--sizes takes row counts >= 1, got {text!r}")
    return sizes


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_memory_ops", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--ops", type=_ops, default=list(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    parser.add_argument("--sizes", type=_sizes, default=None,
                        help="row counts (default: the accuracy plan's of each op)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU under TRITON_INTERPRET=1: the quick configs' widths, 2 small sizes, 2 reps")
    parser.add_argument("--timeline", action="store_true",
                        help="also record each row's GPU kernels in one forward+backward (torch.profiler; CUDA)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated subset of our alternatives to run (`variants`' rows beside the "
                             "default; default: all; `default` always runs)")
    args = parser.parse_args(argv)
    if args.warmup < 0 or args.reps < 1:
        parser.error("--warmup must be >= 0 and --reps >= 1")
    return args


def pick_device(dry_run: bool) -> torch.device:
    """CUDA, or (--dry-run) the CPU under the Triton interpreter; anything else is refused."""
    if dry_run:
        from h3bench.kernels.common import interpreter_active

        if not interpreter_active():
            raise SystemExit("--dry-run runs the kernels under the Triton interpreter: set TRITON_INTERPRET=1")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("tools.bench_memory_ops times CUDA kernels and needs a CUDA GPU (none visible); "
                         "--dry-run checks the script on the CPU under TRITON_INTERPRET=1")
    from h3bench.kernels.common import interpreter_active

    if interpreter_active():
        raise SystemExit("TRITON_INTERPRET is set: unset it to time the compiled kernels on the GPU")
    return torch.device("cuda")


# --- the rows of each op ------------------------------------------------------------------------------

def variants(op: str, params: Any) -> dict[str, Callable]:
    """name -> callable with the op's signature: our kernel at its default launch configuration
    ("default"), then any alternative launch configuration under trial (a kernel without variants has
    that one row)."""
    if op == "adaln_row_gather":
        from h3bench.kernels.adaln_row_gather_api import adaln_row_gather

        mods, chunks = params.modalities, params.chunks
        return {"default": lambda table, ti, tag: adaln_row_gather(table, ti, tag, mods, chunks, check_index=False)}
    if op == "gate_residual":
        from h3bench.kernels.gate_residual_api import gate_residual

        return {"default": lambda res, y, gate, idx: gate_residual(res, y, gate, idx, check_index=False)}
    if op == "final_adaln_out":
        from h3bench.kernels.final_adaln_out_api import final_adaln_out

        eps = params.eps
        return {"default": lambda x, nw, temb, w, b, ti: final_adaln_out(x, nw, temb, w, b, ti, eps,
                                                                         check_index=False)}
    if op == "timestep_sinusoid":
        from h3bench.kernels.timestep_sinusoid_api import timestep_sinusoid

        dim, period, shift = params.freq_dim, params.max_period, params.downscale_freq_shift
        return {"default": lambda t: timestep_sinusoid(t, dim, period, shift)}
    raise ValueError(f"unknown op {op!r}")


def competitors(op: str, params: Any, device: torch.device) -> dict[str, Callable]:
    """The torch composition (the op's `diffusers` row) and, for timestep_sinusoid, SGLang's kernel."""
    import importlib

    found = {}
    for row in ("diffusers",) + (("sglang",) if op == "timestep_sinusoid" else ()):
        adapter = importlib.import_module(f"h3bench.adapters.{op}.{row}").ADAPTER
        loaded = adapter.try_load(device, params)
        found[f"torch_{row}" if row == "diffusers" else row] = loaded if isinstance(loaded, str) else loaded.fn
    return found


# --- measuring ----------------------------------------------------------------------------------------

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _times(step: Callable, setup: Optional[Callable], device: torch.device, warmup: int, reps: int) -> dict:
    """{method: [median, median]}: two timings of `reps` samples after `warmup` calls."""
    from h3bench.harness.timing import STREAM, SYNCHRONIZED, median, take

    for _ in range(warmup):
        if setup is not None:
            setup()
        step()
    _sync(device)
    return {method: [round(median(take(step, device, method, reps, setup)), 2) for _ in range(2)]
            for method in (SYNCHRONIZED, STREAM)}


def _outputs(result) -> list[torch.Tensor]:
    return [result] if isinstance(result, torch.Tensor) else list(result)


def measure_row(op, params, fn: Callable, inputs, grad_outs, ref, default_out, device, warmup: int, reps: int,
                timeline: bool = False) -> tuple[dict, tuple[torch.Tensor, ...]]:
    """(the row's record, its outputs) for one row at one size."""
    from h3bench.harness.execute import as_bits, execute
    from h3bench.harness.probes.accuracy_latency import combined_rel_err, rel_err

    grads = op.differentiable
    record: dict[str, Any] = {}
    outcome = execute(fn, inputs, grad_outs if grads else None, grads, len(op.outputs))
    record["fwd_err"] = combined_rel_err(outcome.outputs, ref.outputs)
    record["grad_err"] = {n: rel_err(outcome.grads[n], ref.grads[n]) for n in grads}
    if default_out is not None:
        record["fwd_bitwise_vs_default"] = all(torch.equal(as_bits(a), as_bits(b))
                                               for a, b in zip(outcome.outputs, default_out))
    if op.param_grads:
        again = execute(fn, inputs, grad_outs, grads, len(op.outputs))
        record["params_repeat"] = all(torch.equal(as_bits(outcome.grads[n]), as_bits(again.grads[n]))
                                      for n in op.param_grads)
        del again
    outputs = outcome.outputs
    del outcome

    values = list(inputs.tensors.values())

    def forward() -> None:
        with torch.no_grad():
            fn(*values)

    record["fwd_us"] = _times(forward, None, device, warmup, reps)
    if grads:
        leaves = [t.detach().requires_grad_() if name in grads else t for name, t in inputs.tensors.items()]
        kept = _outputs(fn(*leaves))

        def clear() -> None:
            for leaf in leaves:
                leaf.grad = None

        def backward() -> None:
            torch.autograd.backward(kept, list(grad_outs), retain_graph=True)

        def fwd_bwd() -> None:
            torch.autograd.backward(_outputs(fn(*leaves)), list(grad_outs))

        record["bwd_us"] = _times(backward, clear, device, warmup, reps)
        del kept
        record["fwd_bwd_us"] = _times(fwd_bwd, clear, device, warmup, reps)
        if timeline:
            record["timeline"] = guarded(kernel_timeline, fwd_bwd, clear, device)
        clear()
    elif timeline:
        record["timeline"] = guarded(kernel_timeline, forward, None, device)
    return record, outputs


def guarded(fn: Callable, *args) -> dict:
    """A diagnostic that fails becomes its error, not the loss of the row's timings."""
    try:
        return fn(*args)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[-500:]}


def kernel_timeline(step: Callable, setup: Optional[Callable], device: torch.device) -> dict:
    """The GPU kernels of one `step` (the second of three profiled), in launch order, with the gaps the
    GPU idled between them: where a forward+backward's time goes (a slow kernel, or the host).
    CUDA only: the interpreter has no kernels to see."""
    if device.type != "cuda":
        return {"skipped": "no CUDA kernels on the CPU"}
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        if setup is not None:
            setup()
        step()
    torch.cuda.synchronize(device)
    host = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            if setup is not None:
                setup()
            torch.cuda._sleep(1)  # a `spin_kernel` marks where each step's kernels begin on the GPU
            t0 = time.perf_counter()
            step()
            host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize(device)
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    marks = [i for i, k in enumerate(kernels) if "spin_kernel" in k.name]
    if len(marks) < 3:
        return {"skipped": f"profiler saw {len(marks)} step markers and {len(kernels)} kernels"}
    mine = kernels[marks[1] + 1:marks[2]]
    if not mine:
        return {"skipped": "no kernel in the profiled step"}
    t0, last = mine[0].time_range.start, mine[-1].time_range.end
    rows, busy, prev_end = [], 0.0, t0
    for k in mine:
        dur = k.time_range.end - k.time_range.start
        rows.append({"kernel": k.name[:90], "start_us": round(k.time_range.start - t0, 1),
                     "gap_before_us": round(max(0.0, k.time_range.start - prev_end), 1), "us": round(dur, 1)})
        busy += dur
        prev_end = max(prev_end, k.time_range.end)
    return {"span_us": round(last - t0, 1), "kernel_us": round(busy, 1),
            "host_us": round(host[1], 1), "kernels": rows}


def floors_us(op, params, rows: int, bandwidth_gbps: float) -> dict:
    fwd = op.floor_bytes(params, rows, backward=False) / (bandwidth_gbps * 1e3)
    if not op.differentiable:
        return {"fwd": fwd}
    both = op.floor_bytes(params, rows, backward=True) / (bandwidth_gbps * 1e3)
    return {"fwd": fwd, "bwd": both - fwd, "fwd_bwd": both}


def fractions(record: dict, floors: dict) -> dict:
    """floor / time for each figure and method (the first of the two timings)."""
    out = {}
    for figure, floor in floors.items():
        times = record.get(f"{figure}_us")
        if times:
            out[figure] = {method: round(floor / pair[0], 4) for method, pair in times.items() if pair[0] > 0}
    return out


def bench_op(op_name: str, sizes: list[int], device: torch.device, args, bandwidth: float,
             log: Callable[[str], None]) -> dict:
    from h3bench.harness.config import load_config
    from h3bench.harness.ops import get_op

    op = get_op(op_name)
    config = load_config(op_name, quick=args.dry_run)
    params = config.inputs
    rows_list = sizes or list(config.accuracy.rows)
    if args.dry_run and not sizes:
        rows_list = rows_list[:2]
    result: dict[str, Any] = {"params": dataclasses.asdict(params), "sizes": {}}
    ours = variants(op_name, params)
    if args.variants:
        keep = {"default"} | {v.strip() for v in args.variants.split(",")}
        ours = {name: fn for name, fn in ours.items() if name in keep}
    others = competitors(op_name, params, device)
    for rows in rows_list:
        inputs = op.make_inputs(params, rows, SEED_INPUT, device)
        grad_outs = op.make_grad_outs(params, rows, SEED_GRAD, device) if op.differentiable else None
        ref = op.reference(params, inputs, grad_outs, op.differentiable, op.name)
        floors = floors_us(op, params, rows, bandwidth)
        size: dict[str, Any] = {"floor_us": floors, "rows": {}}
        default_out = None
        for name, fn in list(ours.items()) + list(others.items()):
            label = name if name in others else f"h3bench_triton[{name}]"
            if isinstance(fn, str):
                size["rows"][label] = {"unavailable": fn}
                continue
            try:
                record, outputs = measure_row(op, params, fn, inputs, grad_outs, ref,
                                              default_out if name in ours else None, device, args.warmup,
                                              args.reps, timeline=args.timeline)
            except Exception as exc:  # a failing row is a line in the table, not the end of the run
                size["rows"][label] = {"error": f"{type(exc).__name__}: {exc}"[-2000:],
                                       "traceback": traceback.format_exc()[-4000:]}
                log(f"{op_name} S={rows} {label}: FAILED {type(exc).__name__}: {str(exc)[-300:]}")
                continue
            if name == "default":
                default_out = outputs
            record["fractions"] = fractions(record, floors)
            size["rows"][label] = record
        del ref, inputs, grad_outs, default_out
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["sizes"][str(rows)] = size
        log(table(op_name, rows, size))
        log(timelines(size))
    return result


def timelines(size: dict) -> str:
    """Each row's kernels, one line each: name, GPU us, the idle gap before it."""
    lines = []
    for label, rec in size["rows"].items():
        tl = rec.get("timeline") if isinstance(rec, dict) else None
        if not tl or "kernels" not in tl:
            continue
        lines.append(f"  {label}: span {tl['span_us']} us, kernels {tl['kernel_us']} us, host {tl['host_us']} us")
        lines += [f"    {k['us']:8.1f} us (gap {k['gap_before_us']:6.1f})  {k['kernel']}" for k in tl["kernels"]]
    return "\n".join(lines)


def table(op_name: str, rows: int, size: dict) -> str:
    floors = size["floor_us"]
    head = f"\n{op_name} S={rows}: floor " + ", ".join(f"{k} {v:.1f} us" for k, v in floors.items())
    lines = [head, f"{'row':<34} {'fwd us (sync/stream)':>22} {'bwd us':>16} {'fwd+bwd us':>16} "
                   f"{'fwd%':>6} {'bwd%':>6} {'f+b%':>6}  errors"]
    for label, rec in size["rows"].items():
        if "fwd_us" not in rec:
            lines.append(f"{label:<34} {rec.get('unavailable') or rec.get('error', '?')}"[:200])
            continue

        def pair(key: str) -> str:
            got = rec.get(key)
            return f"{got['synchronized'][0]:.1f}/{got['stream'][0]:.1f}" if got else "-"

        def pct(figure: str) -> str:
            frac = rec["fractions"].get(figure, {}).get("synchronized")
            return f"{100 * frac:.0f}%" if frac is not None else "-"

        errs = f"fwd {rec['fwd_err']:.2e}"
        if rec["grad_err"]:
            errs += f", grads <= {max(rec['grad_err'].values()):.2e}"
        if rec.get("params_repeat") is False:
            errs += ", PARAMS NOT REPEATABLE"
        if rec.get("fwd_bitwise_vs_default") is False:
            errs += ", fwd differs from default"
        lines.append(f"{label:<34} {pair('fwd_us'):>22} {pair('bwd_us'):>16} {pair('fwd_bwd_us'):>16} "
                     f"{pct('fwd'):>6} {pct('bwd'):>6} {pct('fwd_bwd'):>6}  {errs}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    device = pick_device(args.dry_run)
    if args.dry_run:
        args.warmup, args.reps = min(args.warmup, 1), min(args.reps, 2)
    import triton

    from h3bench.harness.environment import measure_copy_bandwidth

    start = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    bandwidth, moved = measure_copy_bandwidth(device)

    def log(text: str) -> None:
        print(text, flush=True)

    log(f"copy bandwidth {bandwidth:.1f} GB/s ({moved / 1e9:.2f} GB moved per copy)")
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter, dry run)",
        "torch": torch.__version__, "triton": triton.__version__, "dry_run": args.dry_run,
        "warmup": args.warmup, "reps": args.reps, "bandwidth_gbps": bandwidth, "ops": {},
    }
    for op_name in args.ops:
        try:
            report["ops"][op_name] = bench_op(op_name, args.sizes, device, args, bandwidth, log)
        except Exception as exc:  # one op's failure keeps the others
            report["ops"][op_name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            log(f"{op_name}: FAILED {type(exc).__name__}: {exc}")
        with open(args.out, "w") as handle:  # written after every op: a killed run keeps what it measured
            json.dump(report, handle, indent=1, default=str)
    report["bandwidth_end_gbps"] = measure_copy_bandwidth(device)[0]
    report["wall_s"] = round(time.time() - start, 1)
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=1, default=str)
    log(f"\ncopy bandwidth at the end {report['bandwidth_end_gbps']:.1f} GB/s; {report['wall_s']} s; "
        f"written to {args.out}")
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
