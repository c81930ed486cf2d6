"""What a CUDA graph would buy timestep_mlp's no-grad forward at small T on this host (a diagnostic).

    python -m tools.probe_graph_host [--rows 1,8] [--steps 300] [--json FILE]

The harness's stream timing of timestep_mlp at T <= 8 is host-bound on slow hosts (a no-grad call: 67-90 us
of host against ~37 us of kernels, logs/session16-call-1). This times, per call, steps queued back to back
(one synchronize at the end): the plain call `timestep_mlp(x, w1, b1, w2, b2)` with kernels/graph_replay.py
off, the op with its graph replay on (H3BENCH_GRAPHS=1's path), and the same launches captured once in a torch.cuda.CUDAGraph
and replayed (`graph.replay()` alone: the least any graph path costs, before its key lookup and output
handling). Host us = the loop's time before its synchronize;
wall us = to the synchronize. GPU only.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


def loop_us(step, steps: int) -> tuple[float, float]:
    from tools.kernel_times import queued_us
    host, wall = queued_us(step, steps, warmup=20)
    return round(host, 2), round(wall, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_graph_host needs a CUDA device")
    from tools.gemm_kernel_times import _inputs
    from kernels import graph_replay
    from kernels import timestep_mlp as TM
    dev = torch.device("cuda")
    out = {}
    for rows in (int(r) for r in a.rows.split(",")):
        _, t = _inputs(rows, dev)
        with torch.no_grad():
            on = graph_replay.ENABLED
            graph_replay.ENABLED = False
            plain = loop_us(lambda: TM.timestep_mlp(*t), a.steps)
            graph_replay.ENABLED = True   # H3BENCH_GRAPHS=1's path, whatever the environment says
            op = loop_us(lambda: TM.timestep_mlp(*t), a.steps)
            graph_replay.ENABLED = on
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    TM.timestep_mlp(*t)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = TM.timestep_mlp(*t)
            graph.replay()
            torch.cuda.synchronize()
            same = torch.equal(captured, TM.timestep_mlp(*t))
            replay = loop_us(graph.replay, a.steps)
            empty = loop_us(lambda: torch.empty((rows, t[3].shape[0]), device=dev), a.steps)
        out[rows] = {"plain_host_wall_us": plain, "op_graphs_host_wall_us": op, "replay_host_wall_us": replay,
                     "empty_host_wall_us": empty, "replay_bitwise_plain": same}
        print(f"T={rows:5d} plain (graphs off) host/wall {plain}  the op (graphs on) {op}  bare replay {replay}  "
              f"torch.empty {empty}  replay bitwise {same}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
