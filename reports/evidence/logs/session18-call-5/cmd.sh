#!/usr/bin/env bash
# Session 18, call 5 (commit a86cee1): norm_modulate's full probe plan at H = 12288 with the first pass prefetched
# (the default above H = 8192 since 0ad0cd4), our row beside torch F.rms_norm: probes rerun at the new default.
export H3BENCH_COMMIT=a86cee1; mkdir -p $OUT/work && echo "commit a86cee1" > $OUT/work/COMMIT.txt && (time timeout 330 python3 -m reports.cli run --op norm_modulate --device cuda --full --adapters torch_rms_norm,h3bench_triton --set hidden=12288 --out $OUT/work/norm_modulate_h12288_a86cee1_h200.json) > $OUT/work/run.log 2>&1; echo rc=$?; tail -25 $OUT/work/run.log
