#!/usr/bin/env bash
# Session 14, call 4: timestep_mlp's v8 default (GEMM1 on 32 x 32 x 32 fp64 tiles, GEMM2 on 64 x 128 x 32
# fp16x3 tiles with each step's own scales, 6 K chunks). GPU tests (the GEMM ops' and every op's
# strided-input tests), the op's evidence (`h3bench run --op timestep_mlp`, full plan), each launch's
# device time per no-grad forward at T = 1, 8 (v8, v7, v6, cuBLAS), the whole op under v8 in the bench
# (invariance on the GPU, weight gradients twice, errors, T = 1 / 8 / 2048).
set -uo pipefail
W=$OUT/work
mkdir -p "$W"
echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt"
t0=$(date +%s)
H3BENCH_TEST_DEVICE=cuda timeout 170 python3 -m pytest -q tests/test_kernel_gemm.py \
  -k "plumbing or strided or inference or walked or local or counters or row_alone or split or sub_batches or repeat" \
  > "$W/gemm_tests.log" 2>&1
echo "gemm tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$W/gemm_tests.log")"
t0=$(date +%s)
H3BENCH_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -k strided tests/test_kernel.py tests/test_row_gather.py \
  tests/test_kernel_gate_residual.py tests/test_kernel_adaln_row_gather.py tests/test_kernel_final_adaln_out.py \
  tests/test_kernel_timestep_sinusoid.py > "$W/strided_tests.log" 2>&1
echo "strided tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$W/strided_tests.log")"
grep -E "^FAILED" "$W/gemm_tests.log" "$W/strided_tests.log" | head
t0=$(date +%s)
timeout 150 python3 -m reports.cli run --op timestep_mlp --device cuda --full --no-render --quiet \
  --out "$W/timestep_mlp_h200.json" > "$W/timestep_mlp_run.log" 2>&1
echo "h3bench run --op timestep_mlp rc=$? wall $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 60 python3 -m tools.gemm_kernel_times --rows 1,8 --steps-of fwd --configs DEFAULT,FP16X3_LOCAL_V7,FP16X3_V6,cublas \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$? $(( $(date +%s) - t0 )) s"
grep "^T=" "$W/gemm_kernel_times.log" | cut -c1-260
t0=$(date +%s)
timeout 120 python3 -m tools.bench_gemm --skip-ops --skip-configs --mlp-variants DEFAULT --ada-variants "" \
  --out "$W/bench_gemm.json" > "$W/bench_gemm.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"
grep -A12 "timestep_mlp:DEFAULT\|== timestep_mlp" "$W/bench_gemm.log" | head -30
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
