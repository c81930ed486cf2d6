#!/usr/bin/env bash
# On the GPU machine, from the checkout's root: install what tools/pack_cute_dsl_carry.sh packed into SITE
# (default /tmp/site, the path reports/evidence/run_gpu.sh puts its steps on), in two calls on one machine:
#
#   bash tools/install_cute_dsl_carry.sh ir     # the call that carries .cute-ir: keeps the IR library in /root/cute-ir
#   bash tools/install_cute_dsl_carry.sh rest   # the call that carries .cute-rest: installs everything
#
# then imports quack, cutlass and comfy_kitchen to show they load. Rows: adapters/COMPETITORS.md.
set -euo pipefail
SITE=${SITE:-/tmp/site}
KEEP=/root/cute-ir
IR=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
case "${1:-}" in
  ir)
    mkdir -p "$KEEP" && cp .cute-ir/ir.so.xz "$KEEP/" && echo "kept $KEEP/ir.so.xz" ;;
  rest)
    [ -f "$KEEP/ir.so.xz" ] || { echo "no $KEEP/ir.so.xz: run the 'ir' step on this machine first" >&2; exit 3; }
    mkdir -p "$SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      .cute-rest/*.whl
    tar xJf .cute-rest/cutlass_libs_cu13.tar.xz -C "$SITE"
    xz -d -f "$SITE/nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so.xz"
    xz -dc "$KEEP/ir.so.xz" > "$SITE/$IR"
    tar xJf .cute-rest/comfy_kitchen.tar.xz -C "$SITE"
    xz -d -f "$SITE/comfy_kitchen/backends/cuda/_C.abi3.so.xz"
    PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages TVM_FFI_DISABLE_TORCH_C_DLPACK=1 python3 -c "
import quack, cutlass, comfy_kitchen
print('quack', quack.__file__); print('comfy_kitchen', comfy_kitchen.__file__)" ;;
  *) echo "usage: bash tools/install_cute_dsl_carry.sh ir|rest" >&2; exit 2 ;;
esac
