#!/usr/bin/env bash
# Make this checkout importable as the `h3bench` package without pip: DIR/h3bench/<folder> links to each of
# the checkout's five package folders, and DIR/h3bench/testing and DIR/h3bench/cli to harness/testing and
# harness/cli (what the wheel maps: pyproject.toml, [tool.setuptools.package-dir]).
# For a machine with no package index where `pip install -e .` cannot fetch its build backend:
#
#   bash tools/link_package.sh /tmp/h3bench-pkg && export PYTHONPATH=/tmp/h3bench-pkg:$PWD
#
# ($PWD for `python -m tools.X` and the tests.) Edits in the checkout show through the links at once.
set -euo pipefail
DIR=${1:?usage: tools/link_package.sh DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$DIR/h3bench"
for folder in harness adapters kernels reports configs; do
  ln -sfn "$ROOT/$folder" "$DIR/h3bench/$folder"
done
# h3bench.testing and h3bench.cli live in harness/'s tree and install as their own subpackages
# (pyproject.toml says why)
for package in testing cli; do
  ln -sfn "$ROOT/harness/$package" "$DIR/h3bench/$package"
done
