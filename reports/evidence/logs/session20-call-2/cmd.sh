#!/usr/bin/env bash
# NOT RUN in sessions 20 and 21: no device machine was lent (prepared there; run it at the then current commit, after
# session20-call-1 and before session19-call-3; no wheels, no carry; at most ~9.7 min).
# adaln_projection's GEMMs with the K loop warp-specialized (kernels/notes/gemm.md v17, `AP.WS`): the tma GPU
# tests first (the warp-specialized launches bitwise the pointer ones at small sizes, the sets' op bitwise
# POINTER's), then each GEMM's /WS candidates beside its default at T = 1 and 2048 (`bitwise_equal_default`,
# a row alone against T = 2048, stream us), then the WS set and WS_DX3 (dtemb in 3 K chunks: another
# order) against DEFAULT as the whole op (errors, fwd / bwd / fwd+bwd at T = 1, 8, 2048, invariance,
# weight gradients twice).
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q tests/test_kernel_gemm_tma.py \
  -p no:cacheprovider -rf --tb=short > "$W/gpu_tests_tma.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$W/gpu_tests_tma.log"
# the candidates first, apart (the bench skips candidates once its --budget from the start has passed)
timeout 150 python3 -m tools.bench_gemm --skip-ops --mlp-variants '' --ada-variants '' \
  --configs-of adaln_projection --ada-match /WS --ada-rows 1,2048 --out "$W/bench_ws_candidates.json" \
  > "$W/bench_ws_candidates.log" 2>&1
echo "candidates rc=$?"; grep -vE "UserWarning|_warn_once" "$W/bench_ws_candidates.log" | cut -c1-200 | tail -12
timeout 280 python3 -m tools.bench_gemm --skip-ops --skip-configs --mlp-variants '' --ada-variants DEFAULT,WS,WS_DX3 \
  --out "$W/bench_ws_sets.json" > "$W/bench_ws_sets.log" 2>&1
echo "sets rc=$?"; grep -vE "UserWarning|_warn_once" "$W/bench_ws_sets.log" | cut -c1-200 | tail -30
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
