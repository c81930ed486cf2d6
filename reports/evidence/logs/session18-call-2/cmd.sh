#!/usr/bin/env bash
# RUN in session 18 as call 2 (commit 6d8fd82): the prepared command below, unchanged; its logs are beside it.
# NOT RUN in session 17: no device machine was lent that session. The next session runs it after
# session16-call-3's command.
# adaln_projection's three GEMMs through TMA descriptors (kernels/notes/gemm.md v15; kernels/gemm.py
# `_gemm_tma_kernel`, config sets `AP.TMA`, `AP.TMA_STORE`): tools/bench_gemm.py's adaln candidates, dW
# first (each tma candidate's outputs bitwise against the default's at T = 2048, a row alone against
# T = 2048, stream medians at T = 1, 8, 2048 on the same machine as the default's), the op as a whole
# under AP.TMA_STORE (errors, invariance, weight-gradient repeats, fwd / bwd / fwd+bwd against cuBLAS's);
# then the GPU tests of the tma kernel (bitwise the pointer kernel's; the op under AP.TMA and
# AP.TMA_STORE bitwise AP.DEFAULT's) and of the persistent, split and keyed GEMM launches.
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
timeout 420 python3 -m tools.bench_gemm --skip-ops --configs-of adaln_projection --ada-variants TMA_STORE \
  --mlp-variants "" --budget 360 --out "$W/bench_gemm_tma.json" > "$W/bench_gemm_tma.log" 2>&1
echo "bench rc=$?"; tail -30 "$W/bench_gemm_tma.log"
H3BENCH_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q tests/test_kernel_gemm_tma.py tests/test_kernel_gemm.py \
  -k "tma or persistent or split or keyed" -p no:cacheprovider -rf --tb=short > "$W/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$W/gpu_tests.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
