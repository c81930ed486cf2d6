#!/usr/bin/env bash
# Build the RFC's own CUDA ops (the reassembly of RL-Align/RL-Kernel, docs/third_party.md)
# into a scratch copy, never into the source, and name what was built so the evidence can say so.
#
#   bash tools/build_rl_kernel.sh SRC DEST     e.g. SRC=.third_party/rl-kernel-h3 DEST=/tmp/rl-kernel-h3
#   export PYTHONPATH=DEST:$PYTHONPATH         then `import rl_engine` finds the built ops
#
# DEST/H3BENCH_SOURCE gets one line naming the reassembly and its upstream commits (PROVENANCE.md): the
# rows' source strings and the evidence's rl_kernel_commit read it (harness/environment.py). Its time on
# the GPU machine is in the install log (reports/evidence/logs/).
set -euo pipefail
src=${1:?usage: build_rl_kernel.sh SRC DEST}
dest=${2:?usage: build_rl_kernel.sh SRC DEST}
[ -f "$src/PROVENANCE.md" ] || { echo "build_rl_kernel: $src has no PROVENANCE.md: not the reassembly" >&2; exit 2; }
rm -rf "$dest" && mkdir -p "$dest" && cp -r "$src/." "$dest/" && chmod -R u+w "$dest"
provenance=$(sha256sum "$src/PROVENANCE.md" | cut -c1-16)
started=$(date +%s)
(cd "$dest" && TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} \
   python3 minimal/setup_h3_minimal.py build_ext --inplace) > "$dest/build.log" 2>&1 \
  || { echo "build_rl_kernel: build failed; last lines:" >&2; tail -30 "$dest/build.log" >&2; exit 1; }
echo "rl-kernel-h3 reassembly of RL-Align/RL-Kernel (rmsnorm f36aa609, adaln_row_gather fa551c2a; PROVENANCE.md sha256 ${provenance}), built with torch $(python3 -c 'import torch; print(torch.__version__)')" > "$dest/H3BENCH_SOURCE"
echo "build_rl_kernel: built in $(( $(date +%s) - started )) s: $(cat "$dest/H3BENCH_SOURCE")"
(cd "$dest" && PYTHONPATH="$dest" python3 minimal/smoke_test.py)
