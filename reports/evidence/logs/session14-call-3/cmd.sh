#!/usr/bin/env bash
# Session 14, call 3: timestep_mlp with the v7 default (GEMM2 in fp16x3 with each step's own scales, 6 K
# chunks): the op's evidence (`h3bench run --op timestep_mlp`, full plan), each launch's device time
# per no-grad forward and fwd+bwd at T = 1, 4, 8 against v6 and cuBLAS, then GEMM1 / GEMM2 candidates
# (kernel time at small T, stream time at T = 2048) and the whole op under v7 and v6 (invariance,
# repeatability, errors).
set -uo pipefail
W=$OUT/work
mkdir -p "$W"
echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt"
t0=$(date +%s)
H3BENCH_COMMIT=${H3BENCH_COMMIT:-} timeout 200 python3 -m reports.cli run --op timestep_mlp --device cuda --full \
  --no-render --quiet --out "$W/timestep_mlp_h200.json" > "$W/timestep_mlp_run.log" 2>&1
echo "h3bench run --op timestep_mlp rc=$? wall $(( $(date +%s) - t0 )) s"
tail -3 "$W/timestep_mlp_run.log"
t0=$(date +%s)
timeout 90 python3 -m tools.gemm_kernel_times --rows 1,4,8 --steps-of fwd,fwd_bwd --configs DEFAULT,FP16X3_V6,cublas \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$? $(( $(date +%s) - t0 )) s"
grep "^T=" "$W/gemm_kernel_times.log" | cut -c1-300
t0=$(date +%s)
timeout 230 python3 -m tools.bench_gemm --skip-ops --mlp-variants DEFAULT,FP16X3_V6 --ada-variants "" \
  --configs-of timestep_mlp --mlp-precisions fp16x3,fp64 --mlp-kernels fwd1,fwd2 --budget 180 \
  --out "$W/bench_gemm.json" > "$W/bench_gemm.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"
grep -E "fp64|/L|\* fwd" "$W/bench_gemm.log" | cut -c1-160
grep -E "^timestep_mlp|invariance|repeat" "$W/bench_gemm.log" | head
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
