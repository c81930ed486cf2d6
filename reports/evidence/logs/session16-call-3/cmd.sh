#!/usr/bin/env bash
# Session 16, call 3 (carries .third_party for the rl_kernel row): timestep_mlp's no-grad forward replayed as
# a CUDA graph (kernels/graph_replay.py): the GPU tests (graph replay, the GEMM ops), the kernel times and
# host time per call, what a bare replay costs here, then timestep_mlp's full-plan evidence (every row).
set -uo pipefail
export H3BENCH_COMMIT=${H3BENCH_COMMIT:?} H3BENCH_DEADLINE_S=560
W=$OUT/work; mkdir -p "$W"; echo "commit $H3BENCH_COMMIT" > "$W/COMMIT.txt"
H3BENCH_OPS=timestep_mlp H3BENCH_KERNEL_TESTS="tests/test_graph_replay.py tests/test_kernel_gemm.py" H3BENCH_TEST_TIMEOUT=200 \
  bash reports/evidence/run_h200.sh install ops kernel-tests 2>&1 | tail -25
timeout 60 python3 -m tools.gemm_kernel_times --rows 1,8 --steps-of fwd --configs DEFAULT \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$?"; grep "^T=" "$W/gemm_kernel_times.log" | cut -c1-250
timeout 60 python3 -m tools.probe_graph_host --rows 1,8 --json "$W/probe_graph_host.json" > "$W/probe_graph_host.log" 2>&1
echo "graph rc=$?"; tail -2 "$W/probe_graph_host.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work "$OUT"/results.tar.gz && mv /tmp/all.tgz "$OUT"/all.tgz
