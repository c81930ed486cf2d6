#!/usr/bin/env bash
# Session 16, call 2: is GEMM2's ~28 us at small T W2's access pattern (tools/probe_stream.py: the loop's
# loads and MMAs over row-major and tile-major W2, fp32 and fp16 halves, several steps/tiles/stages); the
# presplit stored tile-major (a step reads one contiguous block): bitwise v11's and its time
# (tools/probe_swap_ab.py, tools/gemm_kernel_times.py, GPU tests); what a CUDA graph would save of
# timestep_mlp's no-grad host time (tools/probe_graph_host.py).
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -x tests/test_kernel_gemm.py -k "swap or presplit" \
  -p no:cacheprovider > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -2 "$W/gpu_tests.log"
timeout 200 python3 -m tools.probe_stream --json "$W/probe_stream.json" > "$W/probe_stream.log" 2>&1
echo "stream rc=$?"; grep -v "^stream us" "$W/probe_stream.log" | cut -c1-200
timeout 200 python3 -m tools.probe_swap_ab --rows 1,4,8,16 --configs M64S4,M64S4PS,M16W1S4PS,M128S3PS \
  --json "$W/probe_presplit.json" > "$W/probe_presplit.log" 2>&1
echo "probe rc=$?"; grep -E "kernel us|every" "$W/probe_presplit.log" | cut -c1-400
timeout 90 python3 -m tools.gemm_kernel_times --rows 1,8 --steps-of fwd --configs DEFAULT,FWD2_PRESPLIT \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$?"; grep "^T=" "$W/gemm_kernel_times.log" | cut -c1-250
timeout 120 python3 -m tools.probe_graph_host --rows 1,8 --json "$W/probe_graph_host.json" > "$W/probe_graph_host.log" 2>&1
echo "graph rc=$?"; tail -3 "$W/probe_graph_host.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
