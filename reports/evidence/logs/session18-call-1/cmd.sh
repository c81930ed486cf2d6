#!/usr/bin/env bash
# RUN in session 18 as call 1 (commit 6d8fd82): the prepared command below, unchanged; its logs are beside it.
# NOT RUN in session 16: the call got "no new device machine is lent at present". The next session runs it first.
# Session 16, call 3: two GEMM2 steps an iteration (`pair_steps`: both split, then both steps' products,
# sums in step order; and with each step's two small products as one dot, `merge_products`) checked
# bitwise against v11's tile and timed (tools/probe_swap_ab.py); the no-grad
# forward's kernels under DEFAULT, FWD2_PAIR and FWD2_PRESPLIT (tools/gemm_kernel_times.py); the host time
# a call with the op's CUDA graph replay (kernels/graph_replay.py) against plain launches
# and norm_modulate's at R = 4097 with the harness's own timings (tools/probe_graph_host.py); GPU tests of the graph replay, the pairs, the swap and the presplit; GEMM1's
# float64 MMA on other tiles, bitwise against the default's tile and timed (tools/probe_fwd1.py).
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q tests/test_graph_replay.py tests/test_kernel_gemm.py \
  tests/test_probe_tools.py -k "graph or replay or swap or presplit or pair or probe" -p no:cacheprovider -rf \
  --tb=short > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$W/gpu_tests.log"
timeout 200 python3 -m tools.probe_swap_ab --rows 1,4,8,16 \
  --configs M64S4,M64S4P2,M64S3P2,M64S2P2,M128S3P2,M16W1S4P2,M32W2S3P2,M64S4P2M,M64S3P2M,M64S4PS,U64N128S3P2,U64N128S3P2M \
  --json "$W/probe_pair.json" > "$W/probe_pair.log" 2>&1
echo "probe rc=$?"; grep -E "kernel us|every" "$W/probe_pair.log" | cut -c1-500
timeout 150 python3 -m tools.probe_fwd1 --rows 1,2,4,8,13,16 --json "$W/probe_fwd1.json" > "$W/probe_fwd1.log" 2>&1
echo "fwd1 probe rc=$?"; grep -E "kernel us|every" "$W/probe_fwd1.log" | cut -c1-700
timeout 90 python3 -m tools.gemm_kernel_times --rows 1,8 --steps-of fwd --configs DEFAULT,FWD2_PAIR,FWD2_PAIR_MERGE,FWD2_PRESPLIT \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$?"; grep "^T=" "$W/gemm_kernel_times.log" | cut -c1-250
timeout 90 python3 -m tools.gemm_kernel_times --rows 2048 --steps-of fwd --configs DEFAULT,FWD2_PAIR_ALL \
  --json "$W/gemm_kernel_times_2048.json" > "$W/gemm_kernel_times_2048.log" 2>&1
echo "kernel times T=2048 rc=$?"; grep "^T=" "$W/gemm_kernel_times_2048.log" | cut -c1-250
H3BENCH_GRAPHS=1 timeout 60 python3 -m tools.gemm_kernel_times --rows 1,8 --steps-of fwd --configs DEFAULT \
  --json "$W/gemm_kernel_times_graphs.json" > "$W/gemm_kernel_times_graphs.log" 2>&1
echo "kernel times (H3BENCH_GRAPHS=1) rc=$?"; grep "^T=" "$W/gemm_kernel_times_graphs.log" | cut -c1-250
timeout 90 python3 -m tools.probe_graph_host --rows 1,8 --json "$W/probe_graph_host.json" > "$W/probe_graph_host.log" 2>&1
echo "graph rc=$?"; grep -E "^T=|^norm_modulate" "$W/probe_graph_host.log" | cut -c1-400
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
