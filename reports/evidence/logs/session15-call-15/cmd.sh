#!/usr/bin/env bash
# Session 15, call 15 (same warm machine, nothing carried): the six other ops' full-plan evidence (every row, one
# process an op), then the GPU tests of the GEMM ops (the swapped GEMM2 among them).
export H3BENCH_COMMIT=${H3BENCH_COMMIT:?} H3BENCH_DEADLINE_S=570
H3BENCH_KERNEL_TESTS="tests/test_kernel_gemm.py" H3BENCH_TEST_TIMEOUT=200 \
  bash reports/evidence/run_h200.sh install ops kernel-tests 2>&1 | tail -40
