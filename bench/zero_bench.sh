#!/usr/bin/env bash
# pipeline.zero_stage 0 and 1 side by side at pp2 x dp2: peak RSS per rank,
# model state per parameter, step time (bench/zero_bench.py; --help for its options).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" bench/zero_bench.py --pipeforge "$BUILD_DIR/cli/pipeforge" --work "$BUILD_DIR/bench-zoo" "$@"
