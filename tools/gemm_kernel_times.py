"""Where a timestep_mlp call's time goes at small T, kernel by kernel (a GPU measuring tool, not a probe).

    python -m tools.gemm_kernel_times --rows 1,8 --configs default,cublas --json out.json

For each (`default`: kernels/timestep_mlp_kernel.py with its config set, or `cublas`: the diffusers composition
F.linear, F.silu, F.linear in fp32 with TF32 off; row count T; step: `fwd` under no_grad or `fwd_bwd`) it runs
`--steps` steps after `--warmup` under torch.profiler with CUDA activity and reports each kernel's device
time per step and their sum; then, without the profiler, the wall time per step of `--steps` steps queued
back to back (one synchronize at the end: the harness's stream timing) and the host time per step (the
same loop's time before that synchronize: while the GPU keeps up, the host sets the pace). Against the
op's floor (weights read once: the forward's bytes at the copy bandwidth measured here): the target
(tools/targets.py) is a forward at >= 70% of that floor at T <= 8.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from tools.kernel_times import per_kernel_us, profile_steps

CUBLAS = "cublas"
OURS = "default"


@dataclass
class StepTimes:
    configs: str
    rows: int
    step: str
    per_step_us: dict   # kernel name -> device us per step
    launches_us: list   # [name, mean device us] of each launch of a step, in issue order
    kernels_us: float
    wall_us: float      # per step, steps queued back to back
    host_us: float      # per step, the same loop before its synchronize
    floor_fraction: float   # forward floor / wall (fwd only)


def _inputs(rows: int, device: torch.device) -> tuple:
    from h3bench.harness.config import load_config
    from h3bench.harness.ops import get_op
    params = load_config("timestep_mlp").inputs
    inputs = get_op("timestep_mlp").make_inputs(params, rows, 11, device)
    return params, tuple(inputs.tensors[n] for n in ("x", "w1", "b1", "w2", "b2"))


def _call(configs: str):
    if configs == CUBLAS:
        return lambda x, w1, b1, w2, b2: F.linear(F.silu(F.linear(x, w1, b1)), w2, b2)
    from h3bench.kernels.timestep_mlp_api import timestep_mlp
    return timestep_mlp


def measure(configs: str, rows: int, step_name: str, warmup: int, steps: int, floor_us: float) -> StepTimes:
    device = torch.device("cuda")
    _, tensors = _inputs(rows, device)
    fn = _call(configs)
    if step_name == "fwd":
        def step():
            with torch.no_grad():
                fn(*tensors)
    else:
        leaves = [t.detach().requires_grad_() for t in tensors]
        dy = torch.randn(rows, tensors[3].shape[0], device=device)

        def step():
            for leaf in leaves:
                leaf.grad = None
            fn(*leaves).backward(dy)
    prof, wall, host = profile_steps(step, warmup, steps)
    times = per_kernel_us(prof.key_averages(), steps)
    launches = launch_means(prof.events(), steps)
    return StepTimes(configs, rows, step_name, times, launches, round(sum(times.values()), 2), round(wall, 2),
                     round(host, 2), round(floor_us / wall, 3) if step_name == "fwd" else 0.0)


def launch_means(events, steps: int) -> list:
    """[name, mean us] per launch position of a step: the profiler's kernel events in start order, cut into
    `steps` equal steps (two launches of one kernel, GEMM1 and GEMM2, told apart by position); [] when
    the kernels do not divide into equal steps."""
    kernels = sorted((e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
                      and getattr(e, "device_time_total", 0) > 0), key=lambda e: e.time_range.start)
    if not kernels or len(kernels) % steps:
        return []
    per = len(kernels) // steps
    return [[kernels[i].name[:60], round(sum(kernels[j * per + i].device_time_total for j in range(steps)) / steps, 2)]
            for i in range(per)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8", help="T (comma-separated)")
    parser.add_argument("--configs", default=OURS, help=f"{OURS} (our op), {CUBLAS} (the composition), or both")
    parser.add_argument("--steps-of", default="fwd,fwd_bwd")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    unknown = set(args.configs.split(",")) - {OURS, CUBLAS}
    if unknown:
        parser.error(f"--configs: unknown {', '.join(sorted(unknown))} ({OURS}, {CUBLAS})")
    if not torch.cuda.is_available():
        raise SystemExit("tools.gemm_kernel_times needs a CUDA GPU (it reads the kernels' device times)")
    from h3bench.harness.environment import measure_copy_bandwidth
    from h3bench.harness.ops import get_op
    from tools.bench_gemm import tf32_off
    tf32_off()
    device = torch.device("cuda")
    copy_gbps = measure_copy_bandwidth(device)[0]
    op = get_op("timestep_mlp")
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        params, _ = _inputs(rows, device)
        floor_us = op.floor_bytes(params, rows, backward=False) / (copy_gbps * 1e3)
        for configs in args.configs.split(","):
            for step_name in args.steps_of.split(","):
                r = measure(configs, rows, step_name, args.warmup, args.steps, floor_us)
                results.append(r)
                top = ", ".join(f"{k[:40]} {v}" for k, v in (r.launches_us or list(r.per_step_us.items()))[:6])
                print(f"T={rows:5d} {configs:18s} {step_name:8s} kernels {r.kernels_us:9.2f} us  wall {r.wall_us:9.2f}"
                      f"  host {r.host_us:9.2f}  floor {floor_us:.1f} us ({r.floor_fraction:.0%})  [{top}]", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": round(copy_gbps, 1),
                       "results": [asdict(r) for r in results]}, handle, indent=1)


if __name__ == "__main__":
    main()
