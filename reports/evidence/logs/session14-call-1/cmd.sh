#!/usr/bin/env bash
# Session 14, call 1: timestep_mlp's GEMM2 with each step's own fp16x3 scales (no maxima pass over W2)
# and the no-grad forward's two-launch path. GPU tests of the GEMM ops, each kernel's device time per
# no-grad forward at T = 1, 4, 8 (tools.gemm_kernel_times), the fwd2 candidates and whole-op variants
# (tools.bench_gemm: errors, invariance, repeatability, T = 1 / 8 / 2048 timings).
set -uo pipefail
W=$OUT/work
mkdir -p "$W"
echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$W/gpu.txt"
t0=$(date +%s)
H3BENCH_TEST_DEVICE=cuda timeout 220 python3 -m pytest -q -x tests/test_kernel_gemm.py > "$W/gemm_tests.log" 2>&1
echo "gemm tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$W/gemm_tests.log")"
t0=$(date +%s)
timeout 120 python3 -m tools.gemm_kernel_times --rows 1,4,8 --steps-of fwd \
  --configs DEFAULT,FWD2_LOCAL_128K4,FWD2_LOCAL_64K4,FWD2_LOCAL_64K6,FWD2_LOCAL_128K6,cublas \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$? $(( $(date +%s) - t0 )) s"
cut -c1-260 "$W/gemm_kernel_times.log"
t0=$(date +%s)
timeout 330 python3 -m tools.bench_gemm --skip-ops --mlp-variants DEFAULT,FWD2_LOCAL_64K6,FWD2_LOCAL_128K4,FWD2_LOCAL_64K4 \
  --ada-variants "" --configs-of timestep_mlp --mlp-precisions fp16x3 --mlp-kernels fwd2 --budget 250 \
  --out "$W/bench_gemm.json" > "$W/bench_gemm.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"
tail -45 "$W/bench_gemm.log" | cut -c1-200
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
