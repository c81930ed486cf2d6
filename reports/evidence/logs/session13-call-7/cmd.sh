#!/usr/bin/env bash
# session 13, call 7 (H3BENCH_COMMIT set): the plan in three launches, its place kernel summing scan-chunk totals
# its tests and the global-plan kernel tests, kernel times at H = 5376 over M, the sweep; the backward at
# block 4096 (H = 3072, 4096) against its variants
set -u
W=$OUT/work; mkdir -p $W
echo "$H3BENCH_COMMIT" > $OUT/COMMIT.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt 2>&1
H3BENCH_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -rf --tb=short tests/test_plan.py tests/test_launch_keys.py tests/test_kernel.py -k "plan or table_sizes or bad or global or row_order or load_timing or launch" > $W/kernel_tests.log 2>&1
echo "== tests"; grep -E "^(FAILED|ERROR)" $W/kernel_tests.log | head -5; tail -1 $W/kernel_tests.log
kt() { local name=$1; shift; timeout 150 python3 -m tools.kernel_times "$@" --json $W/$name.json > $W/$name.log 2>&1; echo "== $name rc=$?"; grep -E "^H=|_kernel|Scan|Fill|Error" $W/$name.log | cut -c1-104; }
kt m5376 --hidden 5376 --table-rows 9,64,1024,4096 --variants default
timeout 240 python3 -m tools.sweep_norm_modulate --variants "" --out $W/sweep_norm_modulate.json > $W/sweep.log 2>&1
echo "== sweep rc=$?"; sed -n '/per-sample/,$p' $W/sweep.log | cut -c1-150
kt block4096 --hidden 3072,4096 --table-rows 9 --variants default,bwd-1sm
cd $OUT && tar czf /tmp/all.tgz . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/all.tgz
