#!/usr/bin/env bash
# training.precision bf16 vs fp32 step time on the 24-block GPT of
# bench/vs_pytorch, 2 ranks 1F1B, side by side (bench/precision_bench.py).
#   bash bench/precision_bench.sh                       # 2 runs each of 8 steps
#   bash bench/precision_bench.sh --repeats 3 --steps 12
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" -W ignore bench/precision_bench.py --pipeforge "$BUILD_DIR/cli/pipeforge" "$@"
