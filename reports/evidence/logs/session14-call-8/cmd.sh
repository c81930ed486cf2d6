#!/usr/bin/env bash
# Session 14, call 8: norm_modulate's parameter stage on 16 columns a program at H <= 2048 (NOTES v35: call 6
# and call 7 measured it, kernel_times twice each). GPU tests of norm_modulate's kernels, the parameter
# gradients at 16 and 32 columns compared bitwise, then the sweep at this commit (the committed sweep file
# is session 13's: this one replaces it if it completes).
set -uo pipefail
W=$OUT/work
mkdir -p "$W"
echo "commit ${H3BENCH_COMMIT:-?}" > "$W/COMMIT.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt"
t0=$(date +%s)
H3BENCH_TEST_DEVICE=cuda timeout 170 python3 -m pytest -q -x tests/test_kernel.py tests/test_launch_keys.py > "$W/kernel_tests.log" 2>&1
echo "kernel tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$W/kernel_tests.log")"
grep -E "^FAILED" "$W/kernel_tests.log" | head -5
python3 - > "$W/param_cols_bits.log" 2>&1 <<'PY'
import dataclasses, torch
from kernels import norm_modulate as K
from kernels.norm_modulate_api import norm_modulate
from harness.execute import as_bits
from tools.sweep_norm_modulate import make_case, using_config
for hidden in (1024, 2048):
    _, t = make_case(torch.device("cuda"), hidden, 32768, 9)
    dy = torch.randn_like(t["x"])
    grads = {}
    for cols in (16, 32):
        cfg = dataclasses.replace(K.launch_config(hidden), param_cols=cols)
        with using_config(cfg):
            leaves = [t[n].detach().requires_grad_() for n in ("x", "w", "sh", "sc")]
            norm_modulate(*leaves, t["idx"], 1e-6, check_index=False).backward(dy)
            grads[cols] = [l.grad for l in leaves]
    same = [bool(torch.equal(as_bits(a), as_bits(b))) for a, b in zip(grads[16], grads[32])]
    print(f"H={hidden} param_cols 16 vs 32 bitwise equal (dx, dw, dsh, dsc): {same}")
PY
cat "$W/param_cols_bits.log" | tail -3
t0=$(date +%s)
timeout 200 python3 -m tools.sweep_norm_modulate --variants "" --out "$W/sweep_norm_modulate_h200.json" > "$W/sweep.log" 2>&1
echo "sweep rc=$? $(( $(date +%s) - t0 )) s"
tail -4 "$W/sweep.log"
cd "$OUT" && tar czf /tmp/all.tgz work && rm -rf "$OUT"/work && mv /tmp/all.tgz "$OUT"/all.tgz
