"""Where a norm_modulate fwd+bwd's GPU time goes, kernel by kernel (a GPU measuring tool, not a probe).

    python -m tools.kernel_times --hidden 12288 --table-rows 9 --variants default,bwd-split-r4c2048
    python -m tools.kernel_times --hidden 5376 --table-rows 9,64 --json kernel_times.json

For each (H, M, variant: a preset of tools/sweep_norm_modulate.py, or `torch`: F.rms_norm alone, the
issue's yardstick) it runs `--steps` fwd+bwd steps of the row on the sweep's inputs (R = --rows, bf16)
after `--warmup` steps, under torch.profiler with CUDA activity, and reports each kernel's device time
per step (the profiler's CUDA time of that kernel name, divided by the steps) and the sum. Device times
only: launch gaps and the host are not in them (the
harness's stream timing has those), so the sum is what the kernels cost, the floor arithmetic's
counterpart (kernels/notes/norm_modulate.md). Beside it, without the profiler: the wall time per step of `--steps`
steps queued back to back (one synchronize at the end: what a stream timing sees), the host
synchronizations one step makes (torch.cuda.set_sync_debug_mode, each warning's first line): a wall
time far above the kernels' sum means the host or a synchronization sets the pace; `--trace` writes
the host and device timeline of three steps per case to look at where. Run twice before believing a
difference of a few percent.
"""
from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import asdict, dataclass

import torch


@dataclass
class KernelTimes:
    hidden: int
    table_rows: int
    variant: str
    rows: int
    steps: int
    per_step_us: dict   # kernel name -> device us per fwd+bwd step
    total_us: float
    wall_us: float      # per step, steps queued back to back, no profiler
    syncs: list         # host synchronizations one step makes (first line of each sync-debug warning)


TORCH = "torch"   # a variant name: torch F.rms_norm's fwd+bwd instead of ours


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def per_kernel_us(events, steps: int) -> dict:
    """{kernel name: device us per step} from profiler key averages (their `device_time_total`, us)."""
    out = {}
    for event in events:
        total = getattr(event, "device_time_total", None)
        if total is None:   # older torch names it cuda_time_total
            total = getattr(event, "cuda_time_total", 0.0)
        if total > 0 and getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            out[event.key] = round(total / steps, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def measure(hidden: int, table_rows: int, variant: str, rows: int, warmup: int, steps: int,
            trace: str = "") -> KernelTimes:
    from tools.sweep_norm_modulate import _variant, make_case, using_config
    device = torch.device("cuda")
    _, t = make_case(device, hidden, rows, table_rows)
    step, leaves = fwd_bwd_step(t, variant == TORCH)
    config = None if variant in ("default", TORCH) else _variant(variant, hidden)
    with using_config(config):
        prof, wall, _ = profile_steps(step, warmup, steps)
        syncs = host_syncs(step)
        if trace:   # host and device timeline of a few steps (chrome://tracing, Perfetto)
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as timeline:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
            timeline.export_chrome_trace(f"{trace}/trace_H{hidden}_M{table_rows}_{variant}.json")
    times = per_kernel_us(prof.key_averages(), steps)
    return KernelTimes(hidden, table_rows, variant, rows, steps, times, round(sum(times.values()), 2),
                       round(wall, 2), syncs)


def summed_kernel_us(call, reps: int, warmup: int = 0) -> float:
    """Device time per call of `call`, every kernel it launches summed (torch.profiler's CUDA times over
    `reps` calls after `warmup` unprofiled ones)."""
    prof, _, _ = profile_steps(call, warmup, reps, timed=False)
    return round(sum(per_kernel_us(prof.key_averages(), reps).values()), 2)


def profile_steps(step, warmup: int, steps: int, timed: bool = True):
    """(profiler, wall us per step, host us per step): `warmup` steps, `steps` under torch.profiler with CUDA
    activity, then `steps` more without it, queued back to back: their wall time to the final synchronize,
    and the time the host took to issue them (before that synchronize). Not `timed`: the profiler only
    (the two figures None)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    if not timed:
        return prof, None, None
    host, wall = queued_us(step, steps)
    return prof, wall, host


def queued_us(step, steps: int, warmup: int = 0) -> tuple[float, float]:
    """(host us, wall us) per step: `steps` steps queued back to back after `warmup` ones, the time the host
    took to issue them and the time to the final synchronize."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return (issued - start) / steps * 1e6, (done - start) / steps * 1e6


def fwd_bwd_step(t: dict, torch_row: bool, dy=None):
    """(step, leaves): one fwd+bwd of our row on the case's tensors `t`, or of torch F.rms_norm alone on
    its x and w (the issue's yardstick, no modulation: sh and sc get no gradient), with output gradient
    `dy` (random if None); each step first resets the leaves' .grad, as the harness's fwd_bwd_net step."""
    from h3bench.kernels.norm_modulate_api import norm_modulate
    leaves = [t[n].detach().requires_grad_() for n in ("x", "w", "sh", "sc")]
    dy = torch.randn_like(t["x"]) if dy is None else dy
    hidden = t["x"].shape[-1]

    def step():
        for leaf in leaves:
            leaf.grad = None
        if torch_row:
            torch.nn.functional.rms_norm(leaves[0], (hidden,), leaves[1], 1e-6).backward(dy)
        else:
            norm_modulate(*leaves, t["idx"], 1e-6, check_index=False).backward(dy)
    return step, leaves


def host_syncs(fn) -> list:
    """First lines of the warnings torch's sync debug mode gives while `fn` runs once (each a host sync)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sync_lines(str(w.message) for w in caught)


def sync_lines(messages) -> list:
    """The synchronizing-operation warnings among `messages`, first line each: torch's sync debug mode says
    "called a synchronizing CUDA operation"; its once-only notice that the mode is a prototype is not one."""
    return [m.splitlines()[0] for m in messages if "called a synchronizing" in m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=_ints, default=[5376])
    parser.add_argument("--table-rows", type=_ints, default=[9])
    parser.add_argument("--variants", default="default")
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", default=None)
    parser.add_argument("--trace", default="", help="folder: also a CPU+CUDA profiler trace of 3 steps per case")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tools.kernel_times needs a CUDA device (device times come from the profiler)")
    results = []
    for hidden in args.hidden:
        for table_rows in args.table_rows:
            for variant in args.variants.split(","):
                results.append(measured_or_error(hidden, table_rows, variant, args))
                if args.json:   # after every case: a later case that hangs (and is killed) keeps these
                    with open(args.json, "w") as handle:
                        json.dump(results, handle, indent=1)


def measured_or_error(hidden: int, table_rows: int, variant: str, args) -> dict:
    """One case measured and printed, or its error printed and kept (the cases after it still run: a
    variant that fails to compile at one width must not cost the call the others' times)."""
    try:
        r = measure(hidden, table_rows, variant, args.rows, args.warmup, args.steps, args.trace)
    except Exception as error:  # noqa: BLE001 - reported per case
        message = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        print(f"H={hidden} M={table_rows} {variant}: ERROR {message}", flush=True)
        return {"hidden": hidden, "table_rows": table_rows, "variant": variant, "error": message}
    print(f"H={hidden} M={table_rows} {variant}: {r.total_us:.1f} us of kernels a fwd+bwd step, "
          f"wall {r.wall_us:.1f} us a step back to back, host syncs {r.syncs or 'none'}", flush=True)
    for name, us in r.per_step_us.items():
        print(f"    {us:9.2f}  {name[:100]}", flush=True)
    return asdict(r)


if __name__ == "__main__":
    main()
