#!/usr/bin/env bash
# The steps that produce the committed GPU evidence (reports/evidence/README.md), from the repo root on the
# GPU machine:
#
#   H3BENCH_COMMIT=<sha> bash reports/evidence/run_gpu.sh STEP [STEP ...]
#
# Files are named for the GPU, <op>_<tag>.json: the tag is h100, h200 (from nvidia-smi's name of GPU 0),
# else gpu; H3BENCH_GPU_TAG sets it.
#
# Steps (each logs to $OUT/<step>.log; the files they write go into $OUT/results.tar.gz):
#   stash          copy the .devpkgs/part-NN folders and .devpkgs-small present in the checkout into
#                  /root/devpkgs (Transformer Engine and the CuTe DSL come in several parts:
#                  tools/pack_devpkgs.sh, adapters/COMPETITORS.md); they stay there while the machine does
#   install        the small wheel set (.devpkgs-small) and, once every piece of the big set is in /root/devpkgs
#                  (each part's PIECES file says how many), the big set into /tmp/site with TE's torch extension
#                  built; the modes carry (.devpkgs-modes) into /tmp/modes-site; the RFC's rl-kernel reassembly
#                  (.third_party/rl-kernel-h3) built into /tmp/rl-kernel-h3 (tools/build_rl_kernel.sh), in
#                  parallel with TE's build
#   norm_modulate  `h3bench run --op norm_modulate`: full plan, mode plain, every row
#   ops            the six other ops, full plan, mode plain, every row (one process and evidence file per op;
#                  H3BENCH_OPS picks some)
#   modes          timestep_mlp and adaln_projection under every global mode (the diffusers row: the modes
#                  patch aten, which our Triton row does not use), each mode in its own child process;
#                  H3BENCH_MODE_OPS picks one, H3BENCH_MODES some modes (the file then gets the suffix
#                  H3BENCH_MODES_TAG; `h3bench merge` joins files that split the modes)
#   all            `h3bench run --op all`: the seven ops in one process, full plan, mode plain, every row (the
#                  suite's wall time), one evidence file per op under $OUT/work/all/
#   suite          the same on GPU 0 with H3BENCH_PER_GPU (default 7: every op at once) jobs at a time taking turns (`--gpus 1
#                  --per-gpu K`, harness/gpu_turns.py), one evidence file per op under $OUT/work/suite/
#                  (H3BENCH_OPS picks some)
#   common         the common ops (rms_norm, layer_norm, linear, softmax), quick plan, every row, one file each
#                  under $OUT/work/common_quick_<tag>/; then linear under the seven modes, quick plan
#                  (H3BENCH_COMMON_OPS picks some, comma-separated; the modes run only if linear is picked;
#                  H3BENCH_COMMON_ADAPTERS, comma-separated, runs those rows only, one run per op since
#                  --adapters names one op's rows, and no modes: e.g. transformer_engine once its set is
#                  installed)
#   models         `h3bench model` on docs/examples' Llama LM and Wan2.1 DiT (docs/model_evidence.md, "On a
#                  GPU"): full plan, plain and every global mode, the compiled model's verdict (default mode); one
#                  evidence file each under $OUT/work/models/ (H3BENCH_MODELS picks some: llama_lm, wan_dit, h3_block)
#   kernel-tests   our kernels' tests on the GPU (H3BENCH_KERNEL_TESTS: test files, default every kernel's;
#                  H3BENCH_TEST_TIMEOUT: seconds, default 200)
#   sweep          tools/sweep_norm_modulate.py --variants= (norm_modulate over widths, table sizes and dtypes, no
#                  launch variants: as the committed sweep file; H3BENCH_SWEEP_ARGS: more arguments)
# `install` is idempotent: run again on the same machine it skips what is there already. With
# H3BENCH_DEADLINE_S set, a step that would start after that many seconds of this script is skipped and
# the tools get only the time left. H3BENCH_COMMIT names the commit in the files (the machine may get the
# working tree without its history, or with a stale one: the script refuses a name that is the copy's own
# HEAD while its tracked files differ from it; compute the name where the checkout is). The measuring tools
# (tools/bench_*.py, tools/hostcost.py, tools/kernel_times.py, tools/gemm_kernel_times.py) are not steps:
# run them with `python -m tools.NAME`.
set -uo pipefail
STEPS=" stash install norm_modulate ops modes all suite common models kernel-tests sweep "
for step in "$@"; do
  [[ $STEPS == *" $step "* ]] || { echo "run_gpu.sh: no step '$step' (steps:$STEPS)" >&2; exit 2; }
done
# A copy whose history is older than its tree (a GPU machine that keeps the git state of its first copy)
# has that old commit as HEAD: H3BENCH_COMMIT naming it would record the old commit for a newer tree.
if [ -n "${H3BENCH_COMMIT:-}" ] && head=$(git rev-parse HEAD 2>/dev/null) && [[ $head == "$H3BENCH_COMMIT"* ]] \
    && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  echo "run_gpu.sh: H3BENCH_COMMIT=$H3BENCH_COMMIT is this copy's HEAD, but its tracked files differ from that" \
    "commit: name the commit the tree is (computed where the checkout is), or commit first" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 TVM_FFI_DISABLE_TORCH_C_DLPACK=1
OUT=${OUT:-/tmp/h3bench-out}
ROOT=$PWD
START=$(date +%s)
DEADLINE=${H3BENCH_DEADLINE_S:-100000}
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
mkdir -p "$OUT"
TAG=${H3BENCH_GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 \
  | grep -oiE 'H100|H200' | head -n 1 | tr 'A-Z' 'a-z')}
TAG=${TAG:-gpu}
NVCC=$(readlink -f "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}  # sglang's JIT links against $CUDA_HOME/lib64
SITE=/tmp/site
MODES_SITE=/tmp/modes-site
RLK=/tmp/rl-kernel-h3
M=$ROOT/.devpkgs-modes
PKG=${H3BENCH_PKG:-/tmp/h3bench-pkg}  # this checkout as the h3bench package (no index there for pip install -e)
bash "$ROOT/tools/link_package.sh" "$PKG"
# PYTHONPATH per step: the full SGLang (small set) and the trimmed one (modes carry) must never meet.
FULL_PATH=$PKG:$ROOT:$RLK:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages
MODES_PATH=$PKG:$ROOT:$RLK:$M/vllm-0.34.0:$M/sglang-0.5.23:$M/megatron-core-0.19.2:$MODES_SITE

h3bench() { python3 -m h3bench.cli "$@"; }

big_pieces() { cat /root/devpkgs/PIECES 2>/dev/null || echo "?"; }

step_stash() {  # whatever the checkout holds: big-set parts, the small set's wheels
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
  PYTHONPATH=$path timeout "$(left)" python3 -m h3bench.cli run --op "$ops" --device cuda --full --no-render --quiet --force "$@"
  echo "h3bench run --op $ops $*: rc=$? wall $(( $(date +%s) - t0 )) s"
}

step_norm_modulate() {
  run_ops "$FULL_PATH" norm_modulate --out "$OUT/work/norm_modulate_$TAG.json"
}

step_ops() {
  # one process per op: a kernel that faults (an illegal address kills the CUDA context) costs its op only
  for op in ${H3BENCH_OPS:-timestep_sinusoid timestep_mlp adaln_projection adaln_row_gather gate_residual final_adaln_out}; do
    run_ops "$FULL_PATH" "$op" --out "$OUT/work/${op}_$TAG.json"
  done
}

step_all() {
  run_ops "$FULL_PATH" all --out "$OUT/work/all"
}

step_suite() {
  local ops=all
  [ -n "${H3BENCH_OPS:-}" ] && ops=$(echo "$H3BENCH_OPS" | tr ' ' ',')
  run_ops "$FULL_PATH" "$ops" --gpus 1 --per-gpu "${H3BENCH_PER_GPU:-7}" --out "$OUT/work/suite"
}

step_common() {
  local t0
  t0=$(date +%s)
  local ops=${H3BENCH_COMMON_OPS:-rms_norm,layer_norm,linear,softmax}
  local adapters=${H3BENCH_COMMON_ADAPTERS:-}
  if [[ -n $adapters && $ops == *,* ]]; then  # --adapters names one op's rows: one run per op, same folder
    local op
    for op in ${ops//,/ }; do H3BENCH_COMMON_OPS=$op step_common; done
    return 0
  fi
  local out=$OUT/work/common_quick_$TAG
  [[ $ops == *,* ]] || out=$out/$ops.json  # one op's --out is its file, several ops' a folder
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m h3bench.cli run --op "$ops" \
    --device cuda --quick --no-render --quiet --force --out "$out" ${adapters:+--adapters "$adapters"}
  echo "common ops ($ops${adapters:+, rows $adapters}), quick plan: rc=$? wall $(( $(date +%s) - t0 )) s"
  [[ ,$ops, == *,linear,* && -z $adapters ]] || return 0
  t0=$(date +%s)
  PYTHONPATH=$MODES_PATH timeout "$(left)" python3 -m h3bench.cli run --op linear --device cuda --quick \
    --no-render --quiet --force --mode-timeout 300 \
    --mode plain,vllm,sglang,sglang_ieee,megatron_te_native,megatron_triton,megatron_triton_ieee \
    --out "$OUT/work/linear_modes_quick_$TAG.json"
  echo "linear under the seven modes, quick plan: rc=$? wall $(( $(date +%s) - t0 )) s"
}

step_modes() {
  for op in ${H3BENCH_MODE_OPS:-timestep_mlp adaln_projection}; do
    # the RFC's seven modes (`all` would add torch's deterministic switch, which the RFC does not compare)
    run_ops "$MODES_PATH" "$op" --adapters diffusers --mode-timeout 300 \
      --mode "${H3BENCH_MODES:-plain,vllm,sglang,sglang_ieee,megatron_te_native,megatron_triton,megatron_triton_ieee}" \
      --out "$OUT/work/${op}_modes_$TAG${H3BENCH_MODES_TAG:+_$H3BENCH_MODES_TAG}.json"
  done
}

step_models() {
  mkdir -p "$OUT/work/models"
  local model t0
  for model in ${H3BENCH_MODELS:-llama_lm wan_dit}; do
    t0=$(date +%s)
    PYTHONPATH=$MODES_PATH timeout "$(left)" python3 -m h3bench.cli model "docs/examples/$model.py:build" \
      --device cuda --full --mode all --compile default --mode-timeout 600 --force \
      --out "$OUT/work/models/${model}_$TAG.json"
    echo "h3bench model $model: rc=$? wall $(( $(date +%s) - t0 )) s"
  done
}

step_kernel-tests() {
  # the full report goes to a file (a failure's reason must come back, not only its name)
  # shellcheck disable=SC2086  # the file list is words
  PYTHONPATH=$FULL_PATH H3BENCH_TEST_DEVICE=cuda timeout "$(( $(left) < ${H3BENCH_TEST_TIMEOUT:-200} ? $(left) : ${H3BENCH_TEST_TIMEOUT:-200} ))" python3 -m pytest -q -rf \
    --tb=short ${H3BENCH_KERNEL_TESTS:-tests/test_kernel*.py tests/test_row_gather.py} > "$OUT/work/kernel_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/work/kernel_tests.log" | tail -30
}

step_sweep() {
  # shellcheck disable=SC2086  # the arguments are words
  PYTHONPATH=$FULL_PATH timeout "$(left)" python3 -m tools.sweep_norm_modulate --variants= ${H3BENCH_SWEEP_ARGS:-} \
    --out "$OUT/work/sweep_norm_modulate.json"
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
