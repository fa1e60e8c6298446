#!/usr/bin/env bash
# Peak RSS and wall time of splitting (and starting) big GPT-2 .pt2 models,
# next to torch.export.load of the same files (bench/streaming_split.py).
# Exports the models once with the venv's torch into $BUILD_DIR/bench-zoo/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" -W ignore bench/streaming_split.py --pipeforge "$BUILD_DIR/cli/pipeforge" --work "$BUILD_DIR/bench-zoo" "$@"
