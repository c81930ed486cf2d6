#!/usr/bin/env bash
# Session 14, call 2: GEMM2's K chunks walked by one program a tile above T = 64 (`walk_chunks_above`, the
# same bits as a program per chunk) with local fp16x3 scales. GPU tests of the GEMM ops (all), each
# launch's device time per no-grad forward at T = 1, 8, the fwd2 candidates at T = 1 / 8 / 2048 and
# whole-op variants (errors, invariance, repeatability, timings).
set -uo pipefail
W=$OUT/work
mkdir -p "$W"
echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt"
t0=$(date +%s)
H3BENCH_TEST_DEVICE=cuda timeout 170 python3 -m pytest -q tests/test_kernel_gemm.py > "$W/gemm_tests.log" 2>&1
echo "gemm tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$W/gemm_tests.log")"
grep -E "^FAILED" "$W/gemm_tests.log" | head
t0=$(date +%s)
timeout 120 python3 -m tools.gemm_kernel_times --rows 1,8 --steps-of fwd \
  --configs FWD2_LOCAL_64K6,FWD2_WALK_128K21,FWD2_WALK_64K21,FWD2_WALK_128K42,FWD2_WALK_128K11,cublas \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$? $(( $(date +%s) - t0 )) s"
grep "^T=" "$W/gemm_kernel_times.log" | cut -c1-330
t0=$(date +%s)
timeout 250 python3 -m tools.bench_gemm --skip-ops --mlp-variants FWD2_WALK_128K21,FWD2_WALK_64K21,FWD2_WALK_128K42 \
  --ada-variants "" --configs-of timestep_mlp --mlp-precisions fp16x3 --mlp-kernels fwd2 --budget 190 \
  --out "$W/bench_gemm.json" > "$W/bench_gemm.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"
grep -E "/L|\* fwd2" "$W/bench_gemm.log" | cut -c1-160
python3 - "$W/bench_gemm.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for name, v in d.get("variants", {}).items():
    if not isinstance(v, dict):
        print(name, v); continue
    print(name, "invariance", v.get("invariance", {}).get("all_equal"), "repeat", v.get("repeat"))
    for rows, rec in v.get("rows", {}).items():
        us = rec.get("ours_us", {}); cu = rec.get("cublas_us", {})
        print(f"  T={rows} ours fwd {us.get('fwd')} fwd_bwd {us.get('fwd_bwd')} | cublas fwd {cu.get('fwd')} "
              f"fwd_bwd {cu.get('fwd_bwd')} | err {rec.get('ours_err')} vs {rec.get('cublas_err')}")
PY
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
