#!/usr/bin/env bash
# Builds Pipeforge against the LibTorch inside a pip `torch` 2.x (CUDA + NCCL)
# and runs the suite there. Usage:
#   scripts/build-against-pip-torch.sh [BUILD_DIR] [DEPS_PREFIX]
# DEPS_PREFIX (optional) holds Debian packages unpacked with `dpkg -x` for a
# machine without them installed (yaml-cpp, Boost headers, fmt, CLI11,
# nlohmann-json, GoogleTest); Graphviz is left out there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-pip-torch}
DEPS=${2:-}
PYTHON=${PYTHON:-python3}
TORCH_CMAKE=$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "share", "cmake", "Torch"))')
echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
args=(-DTorch_DIR="$TORCH_CMAKE" -DPIPEFORGE_PYTHON="$(command -v "$PYTHON")" -DCMAKE_BUILD_TYPE=Release)
if [ -n "$DEPS" ]; then
  args+=(-DCMAKE_PREFIX_PATH="$DEPS/usr" -DPIPEFORGE_WITH_GRAPHVIZ=OFF
         -DCMAKE_CXX_FLAGS="-isystem $DEPS/usr/include")
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
cmake -S . -B "$BUILD_DIR" -G Ninja "${args[@]}"
cmake --build "$BUILD_DIR" -j "$(nproc)"
