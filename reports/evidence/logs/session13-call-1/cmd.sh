#!/usr/bin/env bash
# session 13, call 1: where the forward's time goes at large M, wide and narrow H, R = 4097 (tools.kernel_times),
# with the load-timing variants (kernels/NOTES.md v33); GPU tests of test_kernel.py
set -u
W=$OUT/work; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt 2>&1
kt() { local name=$1; shift; timeout 150 python3 -m tools.kernel_times "$@" --json $W/$name.json > $W/$name.log 2>&1; echo "== $name rc=$?"; grep -E "^H=|_fwd|_bwd|rms|Error" $W/$name.log | cut -c1-110; }
kt m_large --hidden 5376 --table-rows 1024,4096 --variants default,fwd-plan-order,fwd-plan-order-first,fwd-tables-first,fwd-reload,walk
kt m9 --hidden 5376 --table-rows 9 --variants default,torch,fwd-tables-first,fwd-reload,fwd-first-reload
kt wide --hidden 12288 --table-rows 9 --variants default,torch,fwd-reload,fwd-w16,fwd-w4,walk
kt narrow --hidden 1024,2048 --table-rows 9 --variants default,torch,bwd-w4-2sm,walk,fwd-reload
kt r4097 --rows 4097 --hidden 5376 --table-rows 9 --variants default,torch,fwd-reload
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -rf --tb=short tests/test_kernel.py tests/test_plan.py > $W/kernel_tests.log 2>&1
echo "== tests"; tail -3 $W/kernel_tests.log
cd $OUT && tar czf /tmp/all.tgz . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/all.tgz
