#!/usr/bin/env bash
# Pack Quack's CuTe DSL stack and comfy-kitchen for a GPU machine that takes at most 64 MiB with each
# copy of the checkout and has no package index: two folders, each carried beside the working tree in its own
# call (`run`'s carry), installed by tools/install_cute_dsl_carry.sh on the same machine while it stays warm.
#
#   .cute-ir/ir.so.xz    the CuTe DSL's IR library (nvidia-cutlass-dsl-libs-cu13's _cutlass_ir .so, 193 MB;
#                        50 MB with xz -9e): the first call copies it to /root/cute-ir
#   .cute-rest/          the wheels of quack-kernels, nvidia-cutlass-dsl and its libs-base and libs-core,
#                        apache-tvm-ffi and torch-c-dlpack-ext; cutlass_libs_cu13.tar.xz (the libs-cu13 wheel's
#                        files but the IR library, its runtime .so xz-compressed); comfy_kitchen.tar.xz
#                        (comfy-kitchen's wheel, its CUDA library xz-compressed and its HIP library left out:
#                        only a ROCm torch imports it): the second call installs everything
#
# The big set (tools/pack_devpkgs.sh) holds the same wheels in six parts; this is the same install in two calls.
# Usage: bash tools/pack_cute_dsl_carry.sh [WHEELS]
#   WHEELS: a folder holding the wheels below (default: `pip download --no-deps` them into .cute-wheels/)
set -euo pipefail
WHEELS=${1:-.cute-wheels}
# the wheels as name-version (their files' prefix): those copied as they are, then the two repacked
COPIED=(quack_kernels-0.6.5 torch_c_dlpack_ext-0.1.5 apache_tvm_ffi-0.1.11 nvidia_cutlass_dsl-4.8.0
        nvidia_cutlass_dsl_libs_base-4.8.0 nvidia_cutlass_dsl_libs_core-4.8.0)
ALL=("${COPIED[@]}" nvidia_cutlass_dsl_libs_cu13-4.8.0 comfy_kitchen-0.2.40)
if [ $# -eq 0 ]; then
  pins=()
  for name in "${ALL[@]}"; do pins+=("${name%-*}==${name##*-}"); done
  python3 -m pip download -q --no-deps --python-version 3.12 --platform manylinux_2_28_x86_64 \
    --only-binary=:all: -d "$WHEELS" "${pins[@]//_/-}"
fi
# every wheel found before anything is written: a missing one leaves the carries as they were
declare -A wheel
for name in "${ALL[@]}"; do
  found=$(ls "$WHEELS"/"$name"-*.whl 2>/dev/null | head -n 1) || true
  [ -n "$found" ] || { echo "pack_cute_dsl_carry.sh: no $name-*.whl in $WHEELS" >&2; exit 2; }
  wheel[$name]=$found
done
IR=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
RUNTIME=nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
rm -rf .cute-ir .cute-rest && mkdir -p .cute-ir .cute-rest
for name in "${COPIED[@]}"; do
  cp "${wheel[$name]}" .cute-rest/
done
python3 -m zipfile -e "${wheel[nvidia_cutlass_dsl_libs_cu13-4.8.0]}" "$work/cu13"
xz -9e -T0 -c "$work/cu13/$IR" > .cute-ir/ir.so.xz && rm "$work/cu13/$IR"
xz -9e -T0 "$work/cu13/$RUNTIME"
tar cJf .cute-rest/cutlass_libs_cu13.tar.xz -C "$work/cu13" .
python3 -m zipfile -e "${wheel[comfy_kitchen-0.2.40]}" "$work/ck"
rm -rf "$work/ck/comfy_kitchen/backends/hip/_C.abi3.so"
xz -9e -T0 "$work/ck/comfy_kitchen/backends/cuda/_C.abi3.so"
tar cJf .cute-rest/comfy_kitchen.tar.xz -C "$work/ck" .
du -sh .cute-ir .cute-rest
