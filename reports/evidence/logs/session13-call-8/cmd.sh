#!/usr/bin/env bash
# session 13, call 8 (H3BENCH_COMMIT set): the final code once more: the wide-row and plan tests on the
# GPU (block-4096 backward shape), and the sweep a second time (two runs of the same code, calls 7 and 8)
set -u
W=$OUT/work; mkdir -p $W
echo "$H3BENCH_COMMIT" > $OUT/COMMIT.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt 2>&1
H3BENCH_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -rf --tb=short tests/test_plan.py tests/test_kernel.py -k "plan or wide_rows or narrow or table_sizes" > $W/kernel_tests.log 2>&1
echo "== tests"; grep -E "^(FAILED|ERROR)" $W/kernel_tests.log | head -5; tail -1 $W/kernel_tests.log
timeout 200 python3 -m tools.sweep_norm_modulate --variants "" --out $W/sweep_norm_modulate_repeat.json > $W/sweep.log 2>&1
echo "== sweep rc=$?"; sed -n '/per-sample/,$p' $W/sweep.log | cut -c1-150
cd $OUT && tar czf /tmp/all.tgz . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/all.tgz
