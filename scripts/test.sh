#!/usr/bin/env bash
# Installs what is missing, builds once, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "${PIPEFORGE_TEST_JOBS:-2}" --timeout 300
