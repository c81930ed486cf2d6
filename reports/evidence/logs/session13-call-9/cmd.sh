#!/usr/bin/env bash
# session 13, call 9 (H3BENCH_COMMIT set): final_adaln_out's evidence a second time (call 5 the first), full plan, every row: its
# forward runs norm_modulate's per-row forward, which reads x again for y since v33 (H = 5376)
set -u
W=$OUT/work; mkdir -p $W
echo "$H3BENCH_COMMIT" > $OUT/COMMIT.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $W/gpu.txt 2>&1
timeout 300 python3 -m reports.cli run --op final_adaln_out --device cuda --full --no-render --quiet --out $W/final_adaln_out_h200.json > $W/final_adaln_out.log 2>&1
echo "== final_adaln_out rc=$?"; tail -5 $W/final_adaln_out.log | cut -c1-200
cd $OUT && tar czf /tmp/all.tgz . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/all.tgz
