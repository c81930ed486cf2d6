#!/usr/bin/env bash
# Session 15, call 1: timestep_mlp's GEMM2 swapped at small T (`swap_ab`, kernels/notes/gemm.md v11):
# tools/probe_swap_ab.py (every candidate bitwise against the default's tile, alone and as rows of
# T = 2048, on four data sets; GEMM2's kernel time per call), then each launch's device time per no-grad
# forward under DEFAULT and the two swap config sets, and the GPU tests of kernels/gemm.py.
set -uo pipefail
W=$OUT/work
mkdir -p "$W"
echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt"
t0=$(date +%s)
timeout 240 python3 -m tools.probe_swap_ab --json "$W/probe_swap_ab.json" > "$W/probe_swap_ab.log" 2>&1
echo "probe rc=$? $(( $(date +%s) - t0 )) s"
grep -E "kernel us|every candidate" "$W/probe_swap_ab.log" | cut -c1-400
grep -c '"equal_default": false' "$W/probe_swap_ab.log"
grep -E "error" "$W/probe_swap_ab.log" | head -3 | cut -c1-400
t0=$(date +%s)
timeout 90 python3 -m tools.gemm_kernel_times --rows 1,8,16 --steps-of fwd --configs DEFAULT,FWD2_SWAP_M64,FWD2_SWAP_M128,cublas \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$? $(( $(date +%s) - t0 )) s"
grep "^T=" "$W/gemm_kernel_times.log" | cut -c1-300
t0=$(date +%s)
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -x tests/test_kernel_gemm.py -k "swap or local or fast or inference" \
  -p no:cacheprovider > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$W/gpu_tests.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
