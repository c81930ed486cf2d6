#!/usr/bin/env bash
# Session 15, call 16 (the same warm machine): the norm_modulate shape sweep at the current kernels (NOTES v35
# included), then each launch's device time per no-grad timestep_mlp forward, v11 (DEFAULT) against v8 and cuBLAS.
export H3BENCH_COMMIT=281764f H3BENCH_DEADLINE_S=300; bash reports/evidence/run_h200.sh sweep 2>&1 | tail -5; mkdir -p $OUT/work2; timeout 60 python3 -m tools.gemm_kernel_times --rows 1,8 --steps-of fwd --configs DEFAULT,FP16X3_LOCAL_V8,cublas --json $OUT/work2/gemm_kernel_times.json 2>&1 | grep "^T=" | cut -c1-200 | tee $OUT/work2/gemm_kernel_times.log
