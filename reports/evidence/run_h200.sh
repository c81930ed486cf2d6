#!/usr/bin/env bash
# The device calls that produce the committed H200 evidence, from the repo root on the lent H200:
#
#   H3BENCH_COMMIT=<sha> bash reports/evidence/run_h200.sh STEP [STEP ...]
#
# Steps (each logs to $OUT/<step>.log; everything it writes goes into $OUT/<step>.tar.gz, since a call
# returns at most 8 files):
#   stash          copy what the call carries of .devpkgs/part-NN (one big part per call) and .devpkgs-small
#                  into /root/devpkgs: Transformer Engine and the CuTe DSL are too big for one call
#                  (adapters/COMPETITORS.md); they live there while the machine stays warm
#   install        the small wheel set (.devpkgs-small) and, when all the big set's pieces are stashed (each
#                  part's PIECES file says how many: tools/pack_devpkgs.sh makes parts of <= 35 MB with the
#                  small set folded in, so a part and the ~30 MB working tree fit one call's 64 MiB), the big set
#                  into /tmp/site with TE's torch extension built; the modes carry (.devpkgs-modes) into
#                  /tmp/modes-site; the RFC's rl-kernel reassembly (.third_party/rl-kernel-h3) built into
#                  /tmp/rl-kernel-h3 (tools/build_rl_kernel.sh), in parallel with TE's build
#   norm_modulate  `h3bench run --op norm_modulate`: full plan, mode plain, every row
#   ops            the six other ops, full plan, mode plain, every row (one process and evidence file per op;
#                  H3BENCH_OPS picks some)
#   modes          timestep_mlp and adaln_projection under every global mode (the diffusers row: the modes
#                  patch aten, which our Triton row does not use), each mode in its own child process;
#                  H3BENCH_MODE_OPS picks one, H3BENCH_MODES some modes (the file then gets the suffix
#                  H3BENCH_MODES_TAG; `h3bench merge` joins the parts of calls that split the modes)
#   all            `h3bench run --op all`: the seven ops in one process, full plan, mode plain, every row (the
#                  suite's wall time), one evidence file per op under $OUT/work/all/
#   kernel-tests   our kernels' tests on the GPU (H3BENCH_KERNEL_TESTS: test files, default every kernel's;
#                  H3BENCH_TEST_TIMEOUT: seconds, default 200)
#   sweep          tools/sweep_norm_modulate.py (norm_modulate over widths, table sizes, dtypes; H3BENCH_SWEEP_ARGS)
#   sweep-variants its launch-config variants only (H3BENCH_SWEEP_ARGS: more arguments, e.g. --variants,
#                  --variant-hidden, --variant-table-rows)
#   bench-memory   tools/bench_memory_ops.py (H3BENCH_BENCH_ARGS: its arguments, e.g. --ops/--sizes/--timeline);
#                  bench-memory2: a second one (H3BENCH_BENCH_ARGS2); bench-gemm: tools/bench_gemm.py
#                  (H3BENCH_GEMM_ARGS: its arguments; H3BENCH_GEMM_BUDGET: seconds before candidates are skipped)
#   hostcost       tools/hostcost.py --breakdown-only: a norm_modulate fwd+bwd's host time by piece
#   hostcost-sinusoid  tools/hostcost.py --sinusoid-only: the host path of timestep_sinusoid's row and SGLang's
#   hostcost-gemm  tools/hostcost.py --gemm-only: the GEMM ops' host paths, keyed launches on and off
#   hostcost-keyed tools/hostcost.py --keyed-only: likewise for our rows of H3BENCH_KEYED_OPS (default: norm_modulate,
#                  final_adaln_out and the two GEMM ops)
#   hostcost-direct the same rows with kernels.common.runner's direct C launcher call on and off
#   hostcost-profile torch.profiler's host-side table of those rows' fwd+bwd
#   probe-swap     tools/probe_swap_ab.py: timestep_mlp's GEMM2 swapped candidates, bitwise against the default
#                  tile and their kernel times (H3BENCH_PROBE_ARGS: its arguments)
#   probe-fp16x3   tools/probe_fp16x3.py: timestep_mlp's large GEMMs as three fp16 products against tf32x3
# `install` is idempotent: a later call on the same (warm) machine skips what is there already. With
# H3BENCH_DEADLINE_S set, a step that would start after that many seconds of the call is skipped and the
# tools get only the time left, so the call returns what it finished inside the device's command limit.
# The machine gets the working tree without its history: H3BENCH_COMMIT names the commit in the files.
set -uo pipefail
export PYTHONUNBUFFERED=1 TVM_FFI_DISABLE_TORCH_C_DLPACK=1
OUT=${OUT:-/tmp/h3bench-out}
ROOT=$PWD
START=$(date +%s)
DEADLINE=${H3BENCH_DEADLINE_S:-100000}
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
mkdir -p "$OUT"
NVCC=$(readlink -f "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}  # sglang's JIT links against $CUDA_HOME/lib64
SITE=/tmp/site
MODES_SITE=/tmp/modes-site
RLK=/tmp/rl-kernel-h3
M=$ROOT/.devpkgs-modes
PKG=/tmp/h3bench-pkg  # this checkout as the h3bench package (no index there for pip install -e)
bash "$ROOT/tools/link_package.sh" "$PKG"
# PYTHONPATH per step: the full SGLang (small set) and the trimmed one (modes carry) must never meet.
FULL_PATH=$PKG:$ROOT:$RLK:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages
MODES_PATH=$PKG:$ROOT:$RLK:$M/vllm-0.34.0:$M/sglang-0.5.23:$M/megatron-core-0.19.2:$MODES_SITE

h3bench() { python3 -m h3bench.reports.cli "$@"; }

big_pieces() { cat /root/devpkgs/PIECES 2>/dev/null || echo "?"; }

step_stash() {  # whatever this call carries: big-set parts, the small set's wheels
  mkdir -p /root/devpkgs
  for part in .devpkgs/part-*; do [ -d "$part" ] && cp -r "$part/." /root/devpkgs/; done
  [ -d .devpkgs-small ] && cp .devpkgs-small/*.whl /root/devpkgs/
  echo "stashed: $(ls /root/devpkgs | grep -c piece) of $(big_pieces) pieces, $(ls /root/devpkgs/*.whl 2>/dev/null | wc -l) wheels"
}

step_install() {
  local pieces
  pieces=$(ls /root/devpkgs 2>/dev/null | grep -c piece)
  if [ -f "$RLK/H3BENCH_SOURCE" ]; then
    echo "rl-kernel already built: $(cat $RLK/H3BENCH_SOURCE)"
  elif [ -d .third_party/rl-kernel-h3 ]; then
    bash tools/build_rl_kernel.sh .third_party/rl-kernel-h3 "$RLK" > "$OUT/work/rl_kernel_build.log" 2>&1 &
    local rlk_pid=$!
  fi
  local all
  all=$(big_pieces)
  if [ -d $SITE/transformer_engine ] || { [ -d $SITE/sglang ] && [ "$pieces" != "$all" ]; }; then
    echo "wheels already installed in $SITE"
  elif [ "$pieces" = "$all" ] && [ -f /root/devpkgs/transformer_engine_torch-2.20.2.tar.gz ]; then
    echo "big set: all $all pieces stashed; installing it with the small set, building TE's torch extension"
    bash /root/devpkgs/install.sh
    rm -rf /tmp/tebuild /tmp/tewheel && mkdir -p /tmp/tebuild
    tar xzf /root/devpkgs/transformer_engine_torch-2.20.2.tar.gz -C /tmp/tebuild
    if (cd /tmp/tebuild/transformer_engine_torch-2.20.2 && NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_CUDA_ARCHS=90 \
          MAX_JOBS=16 PYTHONPATH=$SITE timeout 300 python3 -m pip wheel --no-build-isolation --no-deps --no-index \
          -w /tmp/tewheel . > "$OUT/work/te_build.log" 2>&1); then
      python3 -m zipfile -e /tmp/tewheel/*.whl $SITE && echo "TE extension built"
    else
      echo "TE extension build FAILED; last lines:"; tail -25 "$OUT/work/te_build.log"
    fi
  elif [ -d .devpkgs-small ]; then
    echo "big set not stashed ($pieces of $all pieces): the small set only (+ apache-tvm-ffi for SGLang's JIT kernels)"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE .devpkgs-small/*.whl \
      $(ls "$M"/wheels/apache_tvm_ffi-*.whl 2>/dev/null)
  fi
  if [ -d $MODES_SITE/zmq ]; then
    echo "modes carry already installed"
  elif [ -d "$M/wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $MODES_SITE "$M"/wheels/*.whl \
      && echo "modes carry installed"
  fi
  if [ -n "${rlk_pid:-}" ]; then
    wait "$rlk_pid" && echo "rl-kernel: $(cat $RLK/H3BENCH_SOURCE)" || { echo "rl-kernel build FAILED:"; tail -20 "$OUT/work/rl_kernel_build.log"; }
  fi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  PYTHONPATH=$FULL_PATH h3bench list --device cuda
}

run_ops() {  # run_ops PATH OPS [args...]: one h3bench run, its wall time
  local path=$1 ops=$2; shift 2
  local t0
  t0=$(date +%s)
  PYTHONPATH=$path timeout "$(left)" python3 -m h3bench.reports.cli run --op "$ops" --device cuda --full --no-render --quiet "$@"
  echo "h3bench run --op $ops $*: rc=$? wall $(( $(date +%s) - t0 )) s"
}

step_norm_modulate() {
  run_ops "$FULL_PATH" norm_modulate --out "$OUT/work/norm_modulate_h200.json"
}

step_ops() {
  # one process per op: a kernel that faults (an illegal address kills the CUDA context) costs its op only
  for op in ${H3BENCH_OPS:-timestep_sinusoid timestep_mlp adaln_projection adaln_row_gather gate_residual final_adaln_out}; do
    run_ops "$FULL_PATH" "$op" --out "$OUT/work/${op}_h200.json"
  done
}

step_all() {
  run_ops "$FULL_PATH" all --out "$OUT/work/all"
}

step_modes() {
  for op in ${H3BENCH_MODE_OPS:-timestep_mlp adaln_projection}; do
    # the RFC's seven modes (`all` would add torch's deterministic switch, which the RFC does not compare)
    run_ops "$MODES_PATH" "$op" --adapters diffusers --mode-timeout 300 \
      --mode "${H3BENCH_MODES:-plain,vllm,sglang,sglang_ieee,megatron_te_native,megatron_triton,megatron_triton_ieee}" \
      --out "$OUT/work/${op}_modes_h200${H3BENCH_MODES_TAG:+_$H3BENCH_MODES_TAG}.json"
  done
}

step_kernel-tests() {
  # the full report goes to a file (a failure's reason must come back, not only its name)
  # shellcheck disable=SC2086  # the file list is words
  PYTHONPATH=$FULL_PATH H3BENCH_TEST_DEVICE=cuda timeout "$(( $(left) < ${H3BENCH_TEST_TIMEOUT:-200} ? $(left) : ${H3BENCH_TEST_TIMEOUT:-200} ))" python3 -m pytest -q -rf \
    --tb=short ${H3BENCH_KERNEL_TESTS:-tests/test_kernel*.py tests/test_row_gather.py} > "$OUT/work/kernel_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/work/kernel_tests.log" | tail -30
}

sweep() {  # sweep OUT_NAME [ARGS...]: one tools/sweep_norm_modulate call, H3BENCH_SWEEP_ARGS after ARGS
  local name=$1; shift
  # shellcheck disable=SC2086  # the arguments are words
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.sweep_norm_modulate "$@" ${H3BENCH_SWEEP_ARGS:-} \
    --out "$OUT/work/$name.json"
}

step_sweep() { sweep sweep_norm_modulate; }

# the launch-config variants only (the sweep's last section), and R = 4097's host time
step_sweep-variants() { sweep sweep_variants_norm_modulate --hidden '' --table-rows '' --no-dtypes; }

bench_memory() {  # bench_memory OUT_NAME ARGS: one tools/bench_memory_ops call
  local name=$1
  # shellcheck disable=SC2086  # the arguments are words
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.bench_memory_ops $2 --out "$OUT/work/$name.json"
}

step_bench-memory() { bench_memory bench_memory_ops "${H3BENCH_BENCH_ARGS:-}"; }

step_bench-memory2() { bench_memory bench_memory_ops_2 "${H3BENCH_BENCH_ARGS2:-}"; }  # other ops or sizes

step_hostcost() {  # where a norm_modulate fwd+bwd's host time goes, piece by piece (R = 8)
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.hostcost --breakdown-only --out "$OUT/work"
}

step_hostcost-gemm() {  # the GEMM ops' host paths, keyed launches on and off
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.hostcost --gemm-only
}

step_hostcost-keyed() {  # our rows' host paths, keyed launches on and off (H3BENCH_KEYED_OPS: which ops)
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.hostcost \
    --keyed-only "${H3BENCH_KEYED_OPS:-norm_modulate,final_adaln_out,timestep_mlp,adaln_projection}"
}

step_hostcost-direct() {  # our rows' host paths, the C launcher called directly and through CudaLauncher.__call__
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.hostcost --switch direct \
    --keyed-only "${H3BENCH_KEYED_OPS:-norm_modulate,final_adaln_out,timestep_mlp,adaln_projection}"
}

step_hostcost-profile() {  # torch.profiler's host-side table of our rows' fwd+bwd (H3BENCH_KEYED_OPS)
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.hostcost \
    --profile-rows "${H3BENCH_KEYED_OPS:-norm_modulate,final_adaln_out,timestep_mlp,adaln_projection}"
}

step_hostcost-sinusoid() {
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.hostcost --sinusoid-only
}

step_bench-gemm() {
  # shellcheck disable=SC2086  # the arguments are words
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.bench_gemm --budget "${H3BENCH_GEMM_BUDGET:-$(( $(left) - 20 ))}" \
    ${H3BENCH_GEMM_ARGS:-} --out "$OUT/work/bench_gemm.json"
}

step_probe-swap() {  # tools/probe_swap_ab.py: GEMM2's swapped candidates, bitwise and kernel time (H3BENCH_PROBE_ARGS)
  # shellcheck disable=SC2086  # the arguments are words
  PYTHONPATH=$PKG:$ROOT timeout "$(left)" python3 -m tools.probe_swap_ab ${H3BENCH_PROBE_ARGS:-} --json "$OUT/work/probe_swap_ab.json"
}

step_probe-fp16x3() {
  PYTHONPATH=$PKG:$ROOT timeout "$(left)" python3 -m tools.probe_fp16x3 --budget "$(( $(left) - 60 ))" --out "$OUT/work"
}

mkdir -p "$OUT/work"
for step in "$@"; do
  if [ "$(left)" -le 30 ]; then
    echo "== $step skipped: $(left) s left of H3BENCH_DEADLINE_S=$DEADLINE" | tee -a "$OUT/$step.log"
    continue
  fi
  {
    echo "== $step ($(date -u +%H:%M:%S), commit ${H3BENCH_COMMIT:-unknown})"
    "step_$step"
    echo "== $step done ($(date -u +%H:%M:%S))"
  } 2>&1 | tee -a "$OUT/$step.log"
done
(cd "$OUT/work" && tar czf "$OUT/results.tar.gz" .) && ls -la "$OUT"
