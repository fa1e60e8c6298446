#!/usr/bin/env bash
# Configures and builds Pipeforge (and its test model zoo) into build/.
# Usage: scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
JOBS=${PIPEFORGE_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
