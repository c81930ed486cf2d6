#!/usr/bin/env bash
# RUN in session 19 as call 1 (commit 5bc9e71); its logs are beside it.
# Session 19, call 1: (a) adaln_projection's T switch: every candidate with the pointer set's tiles, steps and
# chunks (`--ada-same-tiles`: TMA or pointers, persistence, stages, grouping) timed at T = 1-2048 and checked
# bitwise against the pointer set (tools/bench_gemm.py), to place the default's TMA_FROM; (b) the graph replay's
# host time once more (tools/probe_graph_host.py: timestep_mlp T = 1, 8 and norm_modulate R = 4097, graphs off /
# on); (c) timestep_mlp's v16 small-T tiles (GEMM1 16x8x32 fp64, GEMM2 swapped 32x16x32 paired) against v11:
# each launch's kernel time per no-grad forward (tools/gemm_kernel_times.py); (d) the GPU tests of the GEMM ops,
# the tma kernel and the graph replay at this commit (v16 defaults: timestep_mlp's small-T tiles, the tiered adaln DEFAULT, graphs on for
# timestep_mlp by default).
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$W/nvidia_smi.txt" 2>&1
timeout 200 python3 -m tools.bench_gemm --skip-ops --configs-of adaln_projection --ada-same-tiles \
  --ada-rows 1,8,16,32,64,128,256,512,1024 --mlp-variants "" --ada-variants "" --budget 180 \
  --out "$W/bench_ada_switch.json" > "$W/bench_ada_switch.log" 2>&1
echo "bench rc=$?"; grep -E "^ [ *] (dw|dx|fwd)|total" "$W/bench_ada_switch.log" | cut -c1-330
timeout 90 python3 -m tools.probe_graph_host --rows 1,8 --json "$W/probe_graph_host.json" > "$W/probe_graph_host.log" 2>&1
echo "graph rc=$?"; grep -E "^T=|^norm_modulate" "$W/probe_graph_host.log" | cut -c1-400
H3BENCH_GRAPHS=0 timeout 90 python3 -m tools.gemm_kernel_times --rows 1,8,16 --steps-of fwd --configs DEFAULT,V11 \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$?"; grep "^T=" "$W/gemm_kernel_times.log" | cut -c1-250
H3BENCH_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q tests/test_graph_replay.py tests/test_kernel_gemm_tma.py \
  tests/test_kernel_gemm.py -p no:cacheprovider -rfs --tb=short > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "FAILED|passed|failed" "$W/gpu_tests.log" | tail -8
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
