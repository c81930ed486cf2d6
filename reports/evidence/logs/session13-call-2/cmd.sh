#!/usr/bin/env bash
# session 13, call 2: the v33 defaults (x read again in the per-row forward above H = 4096; the plan walk
# under the global plan) on the GPU: kernel tests, tools.kernel_times against the old defaults, the sweep
set -u
W=$OUT/work; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt 2>&1
H3BENCH_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -rf --tb=short tests/test_kernel.py tests/test_plan.py tests/test_launch_keys.py > $W/kernel_tests.log 2>&1
echo "== tests"; grep -E "^(FAILED|ERROR)" $W/kernel_tests.log | head -5; tail -1 $W/kernel_tests.log
kt() { local name=$1; shift; timeout 200 python3 -m tools.kernel_times "$@" --json $W/$name.json > $W/$name.log 2>&1; echo "== $name rc=$?"; grep -E "^H=|_fwd|Error" $W/$name.log | cut -c1-104; }
kt m5376 --hidden 5376 --table-rows 9,64,1024,4096 --variants default,fwd-plan-rows,plan-walk-w4,fwd-no-reload
kt wide --hidden 8192,12288 --table-rows 9,1024 --variants default,fwd-plan-rows,fwd-no-reload,fwd-reload-w4
kt narrow --hidden 1024,2048 --table-rows 9,1024 --variants default,torch,fwd-reload,fwd-plan-rows,bwd-w4-2sm
timeout 240 python3 -m tools.sweep_norm_modulate --variants fwd-plan-rows,fwd-no-reload --variant-hidden 5376,12288 --variant-table-rows 9,1024,4096 --out $W/sweep_norm_modulate.json > $W/sweep.log 2>&1
echo "== sweep rc=$?"; sed -n '/per-sample/,$p' $W/sweep.log | cut -c1-150
cd $OUT && tar czf /tmp/all.tgz . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/all.tgz
