#!/usr/bin/env bash
# Session 14, call 6: norm_modulate's narrow backward at H = 1024 and 2048 (issue 13: fwd+bwd 65% of the
# floor and <= torch per sample at 2048): the default against three programs an SM (`bwd-3sm`) and the
# parameter stage's columns per program (`param-c16`, `param-c64`), each kernel's device time per fwd+bwd
# step (tools.kernel_times), twice.
set -uo pipefail
W=$OUT/work
mkdir -p "$W"
echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt"
for run in 1 2; do
  t0=$(date +%s)
  timeout 150 python3 -m tools.kernel_times --hidden 1024,2048 --table-rows 9 \
    --variants default,bwd-3sm,param-c16,param-c64,torch --json "$W/kernel_times_$run.json" > "$W/kernel_times_$run.log" 2>&1
  echo "kernel times run $run rc=$? $(( $(date +%s) - t0 )) s"
done
python3 - "$W" <<'PY'
import json, sys
for run in (1, 2):
    try:
        d = json.load(open(f"{sys.argv[1]}/kernel_times_{run}.json"))
    except Exception as e:
        print(run, e); continue
    rows = d if isinstance(d, list) else d.get("results", d)
    for r in rows:
        top = sorted(r["per_step_us"].items(), key=lambda kv: -kv[1])[:4]
        print(run, r["hidden"], r["variant"], "total", r["total_us"], "wall", r["wall_us"],
              "|", ", ".join(f"{k[:28]} {v}" for k, v in top))
PY
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
