"""What a CUDA graph buys timestep_mlp's no-grad forward at small T, and norm_modulate's at R = 4097 (a diagnostic).

    python -m tools.probe_graph_host [--rows 1,8] [--steps 300] [--json FILE]

The harness's stream timing of timestep_mlp at T <= 8 is host-bound on slow hosts (a no-grad call: 67-90 us
of host against ~37 us of kernels, logs/session16-call-1). This times, per call, steps queued back to back
(one synchronize at the end): the plain call `timestep_mlp(x, w1, b1, w2, b2)` with kernels/graph_replay.py
off, the op with its graph replay on (its default since session 19), and the same launches captured once in a torch.cuda.CUDAGraph
and replayed (`graph.replay()` alone: the least any graph path costs, before its key lookup and output
handling). Host us = the loop's time before its synchronize;
wall us = to the synchronize. Then norm_modulate's inference call (H = 5376, M = 9, bf16) with
kernels/graph_replay.py off and on, and torch's F.rms_norm alone: the same loop, and the harness's own
per-sample and stream medians (harness.timing). GPU only.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys

import torch


def loop_us(step, steps: int) -> tuple[float, float]:
    from tools.kernel_times import queued_us
    host, wall = queued_us(step, steps, warmup=20)
    return round(host, 2), round(wall, 2)


def harness_us(step, device: torch.device, count: int) -> dict:
    """The harness's two figures of `step` (harness.timing.take: CUDA events, medians of `count`)."""
    from h3bench.harness.timing import STREAM, SYNCHRONIZED, median, take
    for _ in range(20):
        step()
    return {m: round(median(take(step, device, m, count)), 2) for m in (SYNCHRONIZED, STREAM)}


@contextlib.contextmanager
def graphs(on: bool):
    """Both ops' graph caches (kernels/graph_replay.py) on or off inside, whatever their defaults and
    H3BENCH_GRAPHS say; as they were after."""
    from h3bench.kernels import norm_modulate_api, timestep_mlp
    caches = (norm_modulate_api.GRAPHS, timestep_mlp.GRAPHS)
    was = [cache.on for cache in caches]
    for cache in caches:
        cache.on = on
    try:
        yield
    finally:
        for cache, state in zip(caches, was):
            cache.on = state


def off_and_on(step, device: torch.device, steps: int) -> dict:
    """`step` with the graph replay off, then on: host / wall per call back to back, the harness's medians."""
    out = {}
    for name, on in (("graphs off", False), ("graphs on", True)):
        with graphs(on):
            out[name] = {"host_wall_us": loop_us(step, steps), **harness_us(step, device, steps)}
    return out


def norm_modulate_rows(rows: int, steps: int) -> dict:
    """norm_modulate's inference call at H = 5376, M = 9, bf16 (the evidence's case), graphs off and on, and
    torch's F.rms_norm alone: host / wall per call back to back, and the harness's per-sample and stream
    medians."""
    from h3bench.kernels.norm_modulate_api import norm_modulate
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    hidden, table = 5376, 9
    x = torch.randn(rows, hidden, generator=g, device=dev).bfloat16()
    w = torch.randn(hidden, generator=g, device=dev).bfloat16()
    sh, sc = (torch.randn(table, hidden, generator=g, device=dev).bfloat16() for _ in range(2))
    idx = torch.randint(0, table, (rows,), generator=g, device=dev)
    with torch.no_grad():
        out = {f"ours, {k}": v for k, v in
               off_and_on(lambda: norm_modulate(x, w, sh, sc, idx, check_index=False), dev, steps).items()}

        def torch_step():
            torch.nn.functional.rms_norm(x, (hidden,), w, 1e-6)
        out["torch F.rms_norm"] = {"host_wall_us": loop_us(torch_step, steps), **harness_us(torch_step, dev, steps)}
    for name, rec in out.items():
        print(f"norm_modulate R={rows} {name:18s} {json.dumps(rec)}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--norm-rows", default="4097", help="norm_modulate's rows (none: skip it)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_graph_host needs a CUDA device")
    from tools.gemm_kernel_times import _inputs
    from h3bench.kernels import graph_replay
    from h3bench.kernels import timestep_mlp as TM
    dev = torch.device("cuda")
    out = {}
    for rows in (int(r) for r in a.rows.split(",")):
        _, t = _inputs(rows, dev)
        with torch.no_grad():
            rec = off_and_on(lambda: TM.timestep_mlp(*t), dev, a.steps)
            held = []   # the op's own graph path stands aside under this capture (it is one)
            graph = graph_replay.capture_cuda_graph(lambda: held.append(TM.timestep_mlp(*t)))
            graph.replay()
            torch.cuda.synchronize()
            rec["bare replay bitwise the plain call"] = torch.equal(held[0], TM.timestep_mlp(*t))
            rec["bare replay"] = loop_us(graph.replay, a.steps)
            rec["torch.empty"] = loop_us(lambda: torch.empty((rows, t[3].shape[0]), device=dev), a.steps)
        out[rows] = rec
        print(f"T={rows:5d} {json.dumps(rec)}", flush=True)
    norm = {r: norm_modulate_rows(int(r), a.steps) for r in a.norm_rows.split(",") if r and r != "none"}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"timestep_mlp": out, "norm_modulate": norm}, f, indent=1)


if __name__ == "__main__":
    main()
