#!/usr/bin/env bash
# Installs what is missing, builds once per configuration and runs the suite:
#   1. the main build (LibTorch 2.13 from .venv's wheel, build/): every test;
#   2. the second build (Debian's LibTorch, build-system/): every test;
#   3. the CUDA build (LibTorch 2.14.1 from .venv-cuda's CUDA wheel, NCCL
#      compiled in, build-cuda/): the stage (split), runtime and train suites
#      and the CUDA tests, on the CPU; every compile and link error in the
#      CUDA and NCCL code shows here. Its venv is 5.5 GB.
# PIPEFORGE_TORCH=wheel, =system or =cuda runs only that one; =both the
# first two; =all (the default) every one.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${PIPEFORGE_TORCH:-all}" in
  both) builds=(wheel system) ;;
  all) builds=(wheel system cuda) ;;
  wheel | system | cuda) builds=("$PIPEFORGE_TORCH") ;;
  *) echo "pipeforge: PIPEFORGE_TORCH is '$PIPEFORGE_TORCH'; use wheel, system, cuda, both or all" >&2; exit 2 ;;
esac
unset PIPEFORGE_BUILD_DIR
# The CUDA build's suites: test executables by folder, and their ctest labels.
CUDA_SUITES="stage|runtime|train"
CUDA_TARGETS="pipeforge split_test manifest_test mutable_state_test points_to_test stage_dataflow_test
  constant_inputs_test runtime_unit_test runtime_stage_test runtime_dist_test runtime_checkpointing_test cuda_test
  train_test train_e2e_test"
for torch in "${builds[@]}"; do
  dir=build
  [ "$torch" = system ] && dir=build-system
  [ "$torch" = cuda ] && dir=build-cuda
  echo "== $torch LibTorch: build ($dir/)"
  labels=()
  if [ "$torch" = cuda ]; then
    PIPEFORGE_TORCH=cuda PIPEFORGE_TARGETS="$CUDA_TARGETS" bash scripts/build.sh
    labels=(-L "^($CUDA_SUITES)\$")
  else
    PIPEFORGE_TORCH=$torch bash scripts/build.sh
  fi
  echo "== $torch LibTorch: tests"
  (cd "$dir" && ctest --output-on-failure -j "${PIPEFORGE_TEST_JOBS:-2}" --timeout 300 "${labels[@]}")
done
