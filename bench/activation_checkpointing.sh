#!/usr/bin/env bash
# Activation checkpointing none vs full vs every_n 2 on bench/vs_pytorch's 24-block GPT,
# 2 ranks, 1F1B, 8 microbatches: peak RSS per rank and step time, with the
# ratios (bench/activation_checkpointing.py; --help for its options).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
PYTHON=${PYTHON:-.venv/bin/python}
exec "$PYTHON" -W ignore bench/activation_checkpointing.py --pipeforge "$BUILD_DIR/cli/pipeforge" \
  --zoo "$BUILD_DIR/zoo" "$@"
