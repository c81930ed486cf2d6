#!/usr/bin/env bash
# NOT RUN in session 19 (no machine was lent after call 2), nor in sessions 20 and 21 (none lent); it runs
# after session20-call-1 and -2, at the commit current then.
# Session 19, call 3: the v16 defaults against the sets they replace, the whole op in one process
# (tools/bench_gemm.py variant sections: errors against float64 and cuBLAS's, fwd / bwd / fwd+bwd stream
# medians at T = 1, 8, 2048 taken twice, rows alone and slices against T = 2048 bitwise, weight gradients
# twice): timestep_mlp DEFAULT (v16) against V11, adaln_projection DEFAULT (tiers by T) against POINTER;
# then the norm_modulate shape sweep at this commit (widths, table sizes, dtypes, R = 4097; no launch
# variants, as the committed sweep; the prefetched first pass above H = 8192 is newer than that file).
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
timeout 250 python3 -m tools.bench_gemm --skip-ops --skip-configs --mlp-variants DEFAULT,V11 \
  --ada-variants DEFAULT,POINTER --out "$W/bench_gemm_v16.json" > "$W/bench_gemm_v16.log" 2>&1
echo "bench rc=$?"; grep -vE "UserWarning|_warn_once" "$W/bench_gemm_v16.log" | cut -c1-200 | head -60
H3BENCH_DEADLINE_S=200 H3BENCH_SWEEP_ARGS="--variants=" bash reports/evidence/run_h200.sh sweep 2>&1 | tail -4
tail -4 "$OUT/sweep.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
