#!/usr/bin/env bash
# Session 14, call 7 (the warm machine of call 6, right after it, tree of commit 6aef8a7: the preset
# param-c8 added): the exact command run, inline in the call. Parameter stage at 8 / 16 / 32 columns a
# program across widths, `tools.kernel_times` twice.
mkdir -p $OUT/work && echo "commit 6aef8a7" > $OUT/work/COMMIT.txt && for run in 1 2; do timeout 120 python3 -m tools.kernel_times --hidden 1024,2048,3072,5376 --table-rows 9 --variants default,param-c8,param-c16 --json $OUT/work/kt_$run.json > $OUT/work/kt_$run.log 2>&1; done; python3 - <<'PY'
import json, os
for run in (1, 2):
    for r in json.load(open(f"{os.environ['OUT']}/work/kt_{run}.json")):
        p = {k[:20]: v for k, v in r["per_step_us"].items() if "params" in k or "bwd_kernel" in k}
        print(run, r["hidden"], r["variant"], "total", r["total_us"], p)
PY
