#!/usr/bin/env bash
# schedule auto under three pipeline.memory_limit values on the zoo's gpt_demo:
# the choice, simulated vs measured activation peak, step time
# (bench/memory_aware_auto.py; --help for its options).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" bench/memory_aware_auto.py --pipeforge "$BUILD_DIR/cli/pipeforge" --zoo "$BUILD_DIR/zoo" "$@"
