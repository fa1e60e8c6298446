#!/usr/bin/env bash
# Configures and builds Pipeforge (and its test model zoo).
# Usage: scripts/build.sh [extra cmake args...]
#   PIPEFORGE_TORCH=wheel (default)  LibTorch 2.13 from .venv's torch wheel, into build/
#   PIPEFORGE_TORCH=system           Debian's LibTorch (libtorch-dev), into build-system/
#   PIPEFORGE_TORCH=cuda             LibTorch 2.14.1 from .venv-cuda's CUDA wheel (NCCL), into build-cuda/
#   PIPEFORGE_BUILD_DIR=DIR          another build folder
#   PIPEFORGE_TARGETS="pipeforge pipeforge_zoo" builds only those targets.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=${PIPEFORGE_TORCH:-wheel}
extra=()
case "$TORCH" in
  wheel) default_dir=build ;;
  system) default_dir=build-system ;;
  cuda)
    # The CUDA wheel's LibTorch (NCCL compiled in), built against the CUDA
    # toolkit beside nvcc; it builds and its tests run without a GPU.
    default_dir=build-cuda
    cuda_root=$(bash scripts/cuda_root.sh) || exit 2
    extra=(-DPIPEFORGE_VENV="$PWD/.venv-cuda" -DCUDAToolkit_ROOT="$cuda_root" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root"
           -DPIPEFORGE_BUILD_BENCH=OFF)
    ;;
  *) echo "pipeforge: PIPEFORGE_TORCH is '$TORCH'; use wheel, system or cuda (or configure CMake yourself with -DPIPEFORGE_TORCH=custom)" >&2; exit 2 ;;
esac
cmake_torch=$TORCH
[ "$TORCH" = cuda ] && cmake_torch=wheel
PIPEFORGE_TORCH=$TORCH bash scripts/install-deps.sh
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-$default_dir}
# Cache hits across clones (CI builds a fresh clone on the same machine).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
JOBS=${PIPEFORGE_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${PIPEFORGE_BUILD_TYPE:-Release} \
    -DPIPEFORGE_TORCH="$cmake_torch" "${extra[@]}" "$@" >/dev/null
fi
targets=()
for t in ${PIPEFORGE_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
