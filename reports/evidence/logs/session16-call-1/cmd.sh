#!/usr/bin/env bash
# NOT RUN in session 15: the call got "no new device machine is lent at present". The next session runs it first.
# Session 15, call 17 (for the next session): where GEMM2's time goes at small T (every swapped candidate landed
# at 28-32 us whatever its programs' count and MMA), and whether W2 split once (`presplit`) removes it:
# tools/probe_swap_ab.py checks the presplit candidates bitwise against the default tile (four data sets, alone
# and as rows of T = 2048) and times them; --diagnose times the default beside configs of other orders and
# precisions (longer steps, more K chunks, FMA chains, tf32x3), torch's copy of W2 and cuBLAS; then each launch
# of a no-grad forward under DEFAULT (v11) and FWD2_PRESPLIT, and the GPU tests of the swap and the presplit.
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
timeout 240 python3 -m tools.probe_swap_ab --rows 1,4,8,16 --configs M64S4,M64S4PS,M16W1S4PS,M128S3PS --diagnose \
  --json "$W/probe_diag.json" > "$W/probe_diag.log" 2>&1
echo "probe rc=$?"; grep -E "kernel us|every" "$W/probe_diag.log" | cut -c1-700
timeout 90 python3 -m tools.gemm_kernel_times --rows 1,8 --steps-of fwd --configs DEFAULT,FWD2_PRESPLIT,cublas \
  --json "$W/gemm_kernel_times.json" > "$W/gemm_kernel_times.log" 2>&1
echo "kernel times rc=$?"; grep "^T=" "$W/gemm_kernel_times.log" | cut -c1-250
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -x tests/test_kernel_gemm.py -k "swap or presplit" \
  -p no:cacheprovider > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$W/gpu_tests.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
