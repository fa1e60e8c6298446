#!/usr/bin/env bash
# One prepared check on a CUDA machine with a pip `torch` 2.x: build against
# its LibTorch, run the suite there, then train the GPT example on the GPU
# (NCCL process group) and compare it with the same run on the CPU (Gloo).
# Usage: scripts/gpu_check.sh [DEPS_PREFIX]   (see build-against-pip-torch.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
DEPS=${1:-}
nvidia-smi -L || true
start=$(date +%s)
if ! bash scripts/build-against-pip-torch.sh build-gpu "$DEPS" >"$OUT/build.log" 2>&1; then
  echo "BUILD FAILED"; grep -E "error|Error" "$OUT/build.log" | head -40; tail -20 "$OUT/build.log"; exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
[ -n "$DEPS" ] && export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"

(cd build-gpu && timeout ${CTEST_BUDGET:-300} ctest -j 14 --timeout 100 -E "two_hosts|TwoHosts" >"$OUT/ctest.log" 2>&1)
grep -E "tests passed|tests failed" "$OUT/ctest.log"
grep -E "\*\*\*|Failed|Timeout" "$OUT/ctest.log" | head -20

# The same training on the GPU (one rank, two stages, NCCL) and on the CPU.
for device in cuda cpu; do
  sed -e "s|^  dir: out/demo_gpt\$|  dir: $OUT/train_$device|" -e "s|dir: out/demo_gpt/ckpt|dir: $OUT/train_$device/ckpt|" \
      -e "s|^  stages_per_rank: .*||" -e "s|schedule: 1F1B|schedule: Interleaved1F1B\n  stages_per_rank: 2|" \
      -e "s|path: build/zoo/gpt_demo.pt|path: build-gpu/zoo/gpt_demo.pt|" -e "s|steps: 150|steps: 40|" \
      configs/demo_gpt.yaml >"$OUT/$device.yaml"
  printf 'distributed:\n  device: %s\n  timeout_s: 60\n' "$device" >>"$OUT/$device.yaml"
  t0=$(date +%s)
  timeout ${TRAIN_BUDGET:-240} build-gpu/cli/pipeforge train --config "$OUT/$device.yaml" --nproc 1 >"$OUT/train_$device.log" 2>&1
  rc=$?
  echo "train $device: rc=$rc $(( $(date +%s) - t0 )) s"
  tail -4 "$OUT/train_$device.log"
done
