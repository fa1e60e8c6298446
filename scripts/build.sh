#!/usr/bin/env bash
# Configures and builds Pipeforge (and its test model zoo).
# Usage: scripts/build.sh [extra cmake args...]
#   PIPEFORGE_TORCH=wheel (default)  LibTorch 2.13 from .venv's torch wheel, into build/
#   PIPEFORGE_TORCH=system           Debian's LibTorch (libtorch-dev), into build-system/
#   PIPEFORGE_BUILD_DIR=DIR          another build folder
#   PIPEFORGE_TARGETS="pipeforge pipeforge_zoo" builds only those targets.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${PIPEFORGE_TORCH:-wheel}
case "$TORCH" in
  wheel) default_dir=build ;;
  system) default_dir=build-system ;;
  *) echo "pipeforge: PIPEFORGE_TORCH is '$TORCH'; use wheel or system (or configure CMake yourself with -DPIPEFORGE_TORCH=custom)" >&2; exit 2 ;;
esac
PIPEFORGE_TORCH=$TORCH bash scripts/install-deps.sh
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-$default_dir}
# Cache hits across clones (CI builds a fresh clone on the same machine).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
JOBS=${PIPEFORGE_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${PIPEFORGE_BUILD_TYPE:-Release} \
    -DPIPEFORGE_TORCH="$TORCH" "$@" >/dev/null
fi
targets=()
for t in ${PIPEFORGE_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
