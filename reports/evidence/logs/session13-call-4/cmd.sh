#!/usr/bin/env bash
# session 13, call 4 (H3BENCH_COMMIT set): the small-batch inference forward probe, and the sweep a second time
set -u
W=$OUT/work; mkdir -p $W
echo "$H3BENCH_COMMIT" > $OUT/COMMIT.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt 2>&1
timeout 120 python3 reports/evidence/logs/session13-call-4/probe_small_forward.py > $W/probe_small_forward.log 2>&1
echo "== probe rc=$?"; cut -c1-300 $W/probe_small_forward.log | tail -8
timeout 240 python3 -m tools.sweep_norm_modulate --variants "" --out $W/sweep_norm_modulate_repeat.json > $W/sweep.log 2>&1
echo "== sweep rc=$?"; sed -n '/per-sample/,$p' $W/sweep.log | cut -c1-150
cd $OUT && tar czf /tmp/all.tgz . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/all.tgz
