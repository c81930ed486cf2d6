#!/usr/bin/env bash
# session 13, call 3 (run with H3BENCH_COMMIT set): the v33 defaults as committed: kernel tests on the GPU,
# `h3bench run --op norm_modulate` (full plan) of our row beside the two rows that need no wheels, the
# sweep (evidence), tools.kernel_times of the changed cases against torch
set -u
W=$OUT/work; mkdir -p $W
echo "$H3BENCH_COMMIT" > $OUT/COMMIT.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt 2>&1
timeout 200 python3 -m reports.cli run --op norm_modulate --adapters diffusers,torch_rms_norm,h3bench_triton --device cuda --full --no-render --quiet --out $W/norm_modulate_h200.json > $W/norm_modulate.log 2>&1
echo "== norm_modulate rc=$?"; tail -5 $W/norm_modulate.log | cut -c1-200
timeout 240 python3 -m tools.sweep_norm_modulate --variants fwd-plan-rows --variant-hidden 5376 --variant-table-rows 1024,4096 --out $W/sweep_norm_modulate.json > $W/sweep.log 2>&1
echo "== sweep rc=$?"; sed -n '/per-sample/,$p' $W/sweep.log | cut -c1-150
kt() { local name=$1; shift; timeout 120 python3 -m tools.kernel_times "$@" --json $W/$name.json > $W/$name.log 2>&1; echo "== $name rc=$?"; grep -E "^H=|_fwd|Error" $W/$name.log | cut -c1-104; }
kt narrow --hidden 1024,2048 --table-rows 9,1024 --variants default,torch,bwd-1sm
kt m5376 --hidden 5376 --table-rows 9,4096 --variants default,torch,fwd-no-reload,fwd-plan-rows
kt wide --hidden 12288 --table-rows 9 --variants default,fwd-no-reload
H3BENCH_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -rf --tb=short tests/test_kernel.py tests/test_plan.py tests/test_launch_keys.py > $W/kernel_tests.log 2>&1
echo "== tests"; grep -E "^(FAILED|ERROR)" $W/kernel_tests.log | head -5; tail -1 $W/kernel_tests.log
cd $OUT && tar czf /tmp/all.tgz . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/all.tgz
