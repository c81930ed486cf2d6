#!/usr/bin/env bash
# The device call that produced reports/evidence/norm_modulate_h200.json, from the repo root on the lent
# H200 (carry .devpkgs-small, and .devpkgs/part-10 when the big set is used). Installs the competitors'
# wheels (adapters/COMPETITORS.md); when the seven big pieces were stashed in /root/devpkgs by earlier
# calls it also installs them and builds Transformer Engine's torch extension. Then it checks our kernel
# on the GPU, times it, runs the full plan and renders the reports. Everything lands in $OUT.
# Call it as `H3BENCH_COMMIT=<sha> bash reports/evidence/run_h200.sh`: the machine gets the working
# tree without its history, so the evidence file can only name the commit it is told.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/h3bench-out}
mkdir -p "$OUT"
{
  date -u
  pieces=$(ls /root/devpkgs 2>/dev/null | grep -c piece)
  if [ "$pieces" = 7 ] && [ -d .devpkgs/part-10 ]; then
    cp -r .devpkgs/part-10/. /root/devpkgs/ && cp .devpkgs-small/*.whl /root/devpkgs/
    bash /root/devpkgs/install.sh
    export PYTHONPATH=/tmp/site
    rm -rf /tmp/tebuild /tmp/tewheel && mkdir -p /tmp/tebuild
    tar xzf /root/devpkgs/transformer_engine_torch-2.20.2.tar.gz -C /tmp/tebuild
    if (cd /tmp/tebuild/transformer_engine_torch-2.20.2 && NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS=90 \
          MAX_JOBS=16 timeout 300 python3 -m pip wheel --no-build-isolation --no-deps --no-index -w /tmp/tewheel . \
          > /tmp/te_build.log 2>&1); then
      python3 -m zipfile -e /tmp/tewheel/*.whl /tmp/site && echo "TE extension built"
    else
      echo "TE extension build FAILED; last lines:"; tail -25 /tmp/te_build.log
    fi
  else
    echo "big set not stashed ($pieces of 7 pieces): installing the small set only"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devpkgs-small/*.whl
  fi
  export PYTHONPATH=$PWD:/tmp/site
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -m harness.cli list --device cuda
  # The evidence first: with little device time left, what matters most must not wait.
  t0=$(date +%s)
  python3 -m harness.cli run --op norm_modulate --out "$OUT/norm_modulate_h200.json"
  echo "harness rc=$? wall $(( $(date +%s) - t0 )) s"
  if [ -z "${H3BENCH_SKIP_KERNEL_TESTS:-}" ]; then
    H3BENCH_TEST_DEVICE=cuda timeout 180 python3 -m pytest -q tests/test_kernel.py 2>&1 | tail -3
  fi
  timeout 120 python3 -m kernels.bench
  timeout 60 python3 -m kernels.hostcost --breakdown-only
} 2>&1 | tee "$OUT/norm_modulate_h200.log"
