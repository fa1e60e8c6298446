#!/usr/bin/env bash
# Prints the CUDA toolkit's root (the folder with bin/nvcc and
# include/cuda_runtime.h): $CUDA_HOME or $CUDA_PATH when set, else where the
# nvcc on PATH really lives (it may be a wrapper script, as /usr/local/bin/nvcc
# is on these machines), else /usr/local/cuda. Exits 1 when none has the headers.
set -uo pipefail
candidates=("${CUDA_HOME:-}" "${CUDA_PATH:-}")
if nvcc_path=$(command -v nvcc); then
  candidates+=("$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")")
fi
candidates+=(/usr/local/cuda)
for c in "${candidates[@]}"; do
  if [ -n "$c" ] && [ -f "$c/include/cuda_runtime.h" ]; then
    echo "$c"
    exit 0
  fi
done
echo "pipeforge: no CUDA toolkit found (looked for include/cuda_runtime.h under: ${candidates[*]}); set CUDA_HOME" >&2
exit 1
