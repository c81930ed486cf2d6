#!/usr/bin/env bash
# RUN in session 18 as call 3 (commit 6d8fd82): the prepared command below, unchanged; its logs are beside it.
# NOT RUN in session 17 or 18: no device machine was lent either session. The next session runs it after
# session17-call-1's command (~4-5 min). Session 18 added the fused backward's presets (kernels/NOTES.md v39:
# fused-p3r4, fused-p3r8, fused-r8, fused) and its GPU tests; a hang of its waits is cut by each step's timeout
# (at most 2 x 200 + 150 + 100 s).
# norm_modulate at H = 12288: the split backward's first pass under other tiles and with each chunk
# loaded one chunk ahead (kernels/NOTES.md v37; sweep presets dots-*), each kernel's device time per
# fwd+bwd step at M = 9 beside the default's (tools/kernel_times.py, two rounds); GPU tests of the
# split backward, its prefetch and the variants' invariance.
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
for round in 1 2; do
  timeout 200 python3 -m tools.kernel_times --hidden 12288 --table-rows 9 \
    --variants default,dots-prefetch,dots-r1w2,dots-r4w8,dots-r4w8-prefetch,dots-c4096w8,fused-p3r4,fused-p3r8,fused-r8,fused \
    --json "$W/kernel_times_dots_$round.json" > "$W/kernel_times_dots_$round.log" 2>&1
  echo "kernel times round $round rc=$?"; grep -E "^H=|dots|fused" "$W/kernel_times_dots_$round.log" | cut -c1-200
done
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q tests/test_kernel.py \
  -k "(dots or split or wide or variants_are or table_sizes or bad_indices) and not fused" \
  -p no:cacheprovider -rf --tb=short > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$W/gpu_tests.log"
# the fused backward's own tests last and apart: a wait that never ends costs this step only
H3BENCH_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q tests/test_kernel.py -k fused \
  -p no:cacheprovider -rf --tb=short > "$W/gpu_tests_fused.log" 2>&1
echo "gpu tests (fused) rc=$?"; tail -3 "$W/gpu_tests_fused.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
