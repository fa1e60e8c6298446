#!/usr/bin/env bash
# Installs what is missing, builds once per configuration and runs the suite:
#   1. the main build (LibTorch 2.13 from .venv's wheel, build/): every test;
#   2. the second build (Debian's LibTorch, build-system/): every test.
# PIPEFORGE_TORCH=wheel or =system runs only that one.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${PIPEFORGE_TORCH:-both}" in
  both) builds=(wheel system) ;;
  wheel | system) builds=("$PIPEFORGE_TORCH") ;;
  *) echo "pipeforge: PIPEFORGE_TORCH is '$PIPEFORGE_TORCH'; use wheel, system or both" >&2; exit 2 ;;
esac
unset PIPEFORGE_BUILD_DIR
for torch in "${builds[@]}"; do
  dir=build
  [ "$torch" = system ] && dir=build-system
  echo "== $torch LibTorch: build ($dir/)"
  PIPEFORGE_TORCH=$torch bash scripts/build.sh
  echo "== $torch LibTorch: tests"
  (cd "$dir" && ctest --output-on-failure -j "${PIPEFORGE_TEST_JOBS:-2}" --timeout 300)
done
