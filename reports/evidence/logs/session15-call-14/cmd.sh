#!/usr/bin/env bash
# Session 15, call 14 (carry: .devpkgs/part-16, .third_party): the last part stashed, the big set and the small
# set installed from /root/devpkgs, TE's torch extension and the rl-kernel reassembly built, then norm_modulate's
# full-plan evidence (every row) and timestep_mlp's GEMM2 swap probe.
export H3BENCH_COMMIT=${H3BENCH_COMMIT:?} H3BENCH_DEADLINE_S=570
H3BENCH_PROBE_ARGS="--rows 1,4,8,16 --configs M64S4,M16W1S4,M16W1S6,M32W2S4,M128S4" \
  bash reports/evidence/run_h200.sh stash install norm_modulate probe-swap 2>&1 | tail -40
