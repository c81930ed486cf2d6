#!/usr/bin/env bash
# NOT RUN in session 17: no device machine was lent that session. The next session runs it after
# session17-call-1's command (~2-3 min).
# norm_modulate at H = 12288: the split backward's first pass under other tiles and with each chunk
# loaded one chunk ahead (kernels/NOTES.md v37; sweep presets dots-*), each kernel's device time per
# fwd+bwd step at M = 9 beside the default's (tools/kernel_times.py, two rounds); GPU tests of the
# split backward, its prefetch and the variants' invariance.
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
for round in 1 2; do
  timeout 150 python3 -m tools.kernel_times --hidden 12288 --table-rows 9 \
    --variants default,dots-prefetch,dots-r1w2,dots-r4w8,dots-r4w8-prefetch,dots-c4096w8 \
    --json "$W/kernel_times_dots_$round.json" > "$W/kernel_times_dots_$round.log" 2>&1
  echo "kernel times round $round rc=$?"; grep -E "^H=|dots" "$W/kernel_times_dots_$round.log" | cut -c1-200
done
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q tests/test_kernel.py -k "dots or split or wide or variants_are" \
  -p no:cacheprovider -rf --tb=short > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$W/gpu_tests.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
