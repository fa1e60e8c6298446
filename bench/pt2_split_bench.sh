#!/usr/bin/env bash
# Split + write of a 96-block GPT .pt2 into 4 stages vs torch.export.load of
# the same file (bench/pt2_split_bench.py). Exports the model once with the
# venv's torch into $BUILD_DIR/bench-zoo/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" -W ignore bench/pt2_split_bench.py --pipeforge "$BUILD_DIR/cli/pipeforge" --work "$BUILD_DIR/bench-zoo" "$@"
