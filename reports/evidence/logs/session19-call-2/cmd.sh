#!/usr/bin/env bash
# RUN in session 19 as call 2 (commit 7f8260d); its logs are beside it.
# Session 19, call 2 (carry: .third_party): timestep_mlp's and adaln_projection's full-plan evidence (every row,
# one process an op) at the v16 defaults (timestep_mlp's small-T tiles and graph replay; adaln_projection's GEMMs
# by T: dW through TMA at every T, the forward and dx from TMA_FROM = 1024), then the GPU tests of the tma
# kernel, the graph replay and the GEMM ops at this commit.
export H3BENCH_COMMIT=${H3BENCH_COMMIT:?} H3BENCH_DEADLINE_S=570
H3BENCH_OPS="timestep_mlp adaln_projection" \
  H3BENCH_KERNEL_TESTS="tests/test_kernel_gemm_tma.py tests/test_graph_replay.py tests/test_kernel_gemm.py" \
  H3BENCH_TEST_TIMEOUT=230 bash reports/evidence/run_h200.sh install ops kernel-tests 2>&1 | tail -40
