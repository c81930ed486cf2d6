#!/usr/bin/env bash
# NOT RUN in session 15: the call got "no new device machine is lent at present". The next session runs it first.
# Session 15, call 17: where GEMM2's time goes at small T (every swapped candidate landed at 28-32 us whatever
# its programs' count and MMA): tools/probe_swap_ab.py --diagnose times the default beside configs of other
# orders and precisions (longer steps, more K chunks, FMA chains, tf32x3), torch's copy of W2 and cuBLAS.
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
timeout 200 python3 -m tools.probe_swap_ab --rows 1,8 --configs M64S4 --diagnose --json "$W/probe_diag.json" > "$W/probe_diag.log" 2>&1
echo "rc=$?"; grep -E "kernel us|every" "$W/probe_diag.log" | cut -c1-700
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
