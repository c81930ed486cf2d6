#!/usr/bin/env bash
# NOT RUN in sessions 20 and 21: no device machine was lent (prepared there; run it first next time, before
# session19-call-3's command, at the then current commit; no wheels, no carry; at most ~9.5 min).
# norm_modulate at H = 12288 without the split backward's first pass (kernels/NOTES.md v41-v42, `split_dots`,
# `dots_ahead`): the GPU tests new this session first (every LaunchConfig variant's batch invariance, x's
# gradient alone, ~14 tests), then those of the new variants (exchange bitwise recompute, float64 bounds, a row
# alone as in the batch, parameter gradients repeating; the exchange waits apart, under their own timeout: a
# wait that never ended would cost that step only, and a failed test leaves the exchange out of the timing), then
# each kernel's device time per fwd+bwd step at M = 9 (local plan) and M = 64 (global plan) beside the
# default's (tools/kernel_times.py, two rounds; each round prints as it goes, the likeliest winners first).
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
H3BENCH_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q tests/test_kernel.py \
  -k "(variants_are or x_gradient) and not exchange" \
  -p no:cacheprovider -rf --tb=short > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$W/gpu_tests.log"
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q tests/test_kernel.py -k "exchange or block_dots" \
  -p no:cacheprovider -rf --tb=short > "$W/gpu_tests_exchange.log" 2>&1
rc=$?; echo "gpu tests (exchange) rc=$rc"; tail -3 "$W/gpu_tests_exchange.log"
VARIANTS=default,dots-exchange,dots-exchange-ahead-r1,dots-exchange-r1,dots-exchange-ahead-c2048,dots-exchange-c2048,dots-recompute-r1,dots-recompute
# a failed exchange test leaves the exchange out (a timeout alone may be compiles on a slow host: kept)
grep -q "^FAILED" "$W/gpu_tests_exchange.log" && VARIANTS=default,dots-recompute-r1,dots-recompute
for round in 1 2; do
  limit=$([ "$round" = 1 ] && echo 230 || echo 120)
  timeout "$limit" python3 -m tools.kernel_times --hidden 12288 --table-rows 9,64 --variants "$VARIANTS" \
    --json "$W/kernel_times_block_dots_$round.json" > "$W/kernel_times_block_dots_$round.log" 2>&1
  echo "kernel times round $round rc=$?"; grep -E "^H=" "$W/kernel_times_block_dots_$round.log" | cut -c1-200
done
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
