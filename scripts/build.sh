#!/usr/bin/env bash
# Configures and builds Pipeforge (and its test model zoo) into build/.
# Usage: scripts/build.sh [extra cmake args...]
# PIPEFORGE_TARGETS="pipeforge pipeforge_zoo" builds only those targets.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
# Cache hits across clones (CI builds a fresh clone on the same machine).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
JOBS=${PIPEFORGE_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${PIPEFORGE_BUILD_TYPE:-Release} "$@" >/dev/null
fi
targets=()
for t in ${PIPEFORGE_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
