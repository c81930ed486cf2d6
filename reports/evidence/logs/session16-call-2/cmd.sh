#!/usr/bin/env bash
# Session 16, call 2: is GEMM2's ~28 us at small T W2's access pattern (tools/probe_stream.py: the loop's
# loads and MMAs over row-major and tile-major W2, fp32 and fp16 halves, several steps/tiles/stages), and
# what would a CUDA graph save of timestep_mlp's no-grad host time (tools/probe_graph_host.py)?
set -uo pipefail
W=$OUT/work; mkdir -p "$W"; echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
timeout 300 python3 -m tools.probe_stream --json "$W/probe_stream.json" > "$W/probe_stream.log" 2>&1
echo "stream rc=$?"; cat "$W/probe_stream.log" | grep -v "^stream us" | cut -c1-200
timeout 120 python3 -m tools.probe_graph_host --rows 1,8 --json "$W/probe_graph_host.json" > "$W/probe_graph_host.log" 2>&1
echo "graph rc=$?"; tail -5 "$W/probe_graph_host.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
