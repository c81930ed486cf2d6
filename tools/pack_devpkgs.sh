#!/usr/bin/env bash
# Pack every wheel the GPU machine's rows need (the big set: Transformer Engine, the CuTe DSL, comfy-kitchen; the
# small set: SGLang, Liger, Quack and their imports) into .devpkgs/part-NN folders that each fit beside the working
# tree in what one run takes to the GPU machine (64 MiB in all, the tracked tree included):
#
#   DEVPKGS=/path/to/devpkgs bash tools/pack_devpkgs.sh [LIMIT_MB]
#   bash tools/pack_devpkgs.sh --devpkgs /path/to/devpkgs [LIMIT_MB]
#
# LIMIT_MB (default 35): decimal MB per part, pieces and wheels together. Then `run_gpu.sh stash` once per
# part but the smallest, and the smallest with `.third_party` in the run of `stash install ...`
# (adapters/COMPETITORS.md). Needs the devpkgs tool (it cuts wheels into pieces) and pip with a package index.
#
# PACK_GROUPS (default all of them, comma-separated) packs some of the rows' libraries only, each group with
# what it imports: te (Transformer Engine and its torch extension's sdist), cute (the CuTe DSL and Quack),
# sglang (with cute), liger, comfy (comfy-kitchen). Every part transfers in a run of its own, so a run that
# needs one library is fewer runs (each group's size and parts: adapters/COMPETITORS.md).
set -euo pipefail
if [ "${1:-}" = "--devpkgs" ]; then
  DEVPKGS=${2:?--devpkgs needs a path: the devpkgs tool}
  shift 2
fi
DEVPKGS=${DEVPKGS:-}
[ -n "$DEVPKGS" ] || { echo "pack_devpkgs.sh: set DEVPKGS=/path/to/devpkgs or pass --devpkgs PATH" >&2; exit 2; }
[ -x "$DEVPKGS" ] || { echo "pack_devpkgs.sh: $DEVPKGS is not an executable devpkgs tool" >&2; exit 2; }
LIMIT_MB=${1:-35}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$ROOT/.devpkgs
declare -A GROUP=(
  [te]="transformer-engine-cu13==2.20.2 transformer-engine==2.20.2 nvdlfw-inspect==0.2.2 pydantic==2.14.4
        pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0"
  [cute]="nvidia-cutlass-dsl-libs-cu13==4.8.0 nvidia-cutlass-dsl==4.8.0 nvidia-cutlass-dsl-libs-base==4.8.0
          nvidia-cutlass-dsl-libs-core==4.8.0 apache-tvm-ffi==0.1.11 quack-kernels==0.6.5 torch-c-dlpack-ext==0.1.5"
  [sglang]="sglang==0.5.23 orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 starlette==1.10.0"
  [liger]="liger-kernel==0.8.5"
  [comfy]="comfy-kitchen==0.2.40"
)
SELECTED=${PACK_GROUPS:-te,cute,sglang,liger,comfy}
if [[ ",$SELECTED," == *,sglang,* ]]; then SELECTED="$SELECTED,cute"; fi  # SGLang's norm kernels are CuTe DSL's
PACKAGES=()
for group in $(tr ',' '\n' <<< "$SELECTED" | sort -u); do
  [ -n "${GROUP[$group]:-}" ] || { echo "pack_devpkgs.sh: no group '$group' (groups: ${!GROUP[*]})" >&2; exit 2; }
  # shellcheck disable=SC2206  # a group is words (name==version, no glob characters)
  PACKAGES+=(${GROUP[$group]})
done
rm -rf "$DIR"
# devpkgs cuts wheels into pieces of PART_MB MiB and groups small wheels into parts of their own
PART_MB=$(( LIMIT_MB * 1000 * 1000 / 1048576 - 1 )) "$DEVPKGS" pack "$DIR" "${PACKAGES[@]}" | grep -v WARNING
# transformer_engine_torch is an sdist (built on the machine against its torch): devpkgs takes wheels only. pip
# fetches it by name; --no-binary names this one package, so its build requirements (pip prepares the sdist's
# metadata) may come as wheels.
SDIST_PATH=
if [[ ",$SELECTED," == *,te,* ]]; then
  SDIST=transformer_engine_torch-2.20.2.tar.gz
  SDIST_DIR=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --no-binary transformer-engine-torch transformer-engine-torch==2.20.2 \
    -d "$SDIST_DIR"
  echo "4c40ced8a6261649e689076f198d4feaf02277b1ba18931a66eccdaceb33c43e  $SDIST_DIR/$SDIST" | sha256sum -c -
  SDIST_PATH=$SDIST_DIR/$SDIST
fi
python3 - "$DIR" "$LIMIT_MB" "$SDIST_PATH" <<'EOF'
"""Merge the parts, smallest first, into as few as fit LIMIT_MB each; the sdist (if packed) rides with the
smallest; every part gets PIECES (how many wheel pieces make the whole set: run_gpu.sh's install waits for them)."""
import shutil, sys
from pathlib import Path
root, limit, sdist = Path(sys.argv[1]), int(sys.argv[2]) * 1000 * 1000, sys.argv[3]
def size(p): return sum(f.stat().st_size for f in p.iterdir() if f.name not in ("install.sh", "PIECES"))
parts = sorted(root.glob("part-*"), key=size)
merged = True
while merged and len(parts) > 1:
    merged = False
    for a in parts:
        for b in parts:
            if a is not b and size(a) + size(b) <= limit:
                for f in a.iterdir():
                    if f.name not in ("install.sh", "PIECES"):
                        shutil.move(str(f), b / f.name)
                shutil.rmtree(a)
                parts = sorted(root.glob("part-*"), key=size)
                merged = True
                break
        if merged:
            break
if sdist:
    shutil.copy(sdist, parts[0] / Path(sdist).name)
pieces = sum(1 for p in parts for f in p.iterdir() if ".piece-" in f.name)
for p in parts:
    (p / "PIECES").write_text(f"{pieces}\n")
    print(f"{p.name} {size(p) / 1e6:.1f} MB" + ("  <- with the last run (stash install)" if p == parts[0] else ""))
print(f"{len(parts)} parts, {pieces} pieces")
EOF
