#!/bin/bash
# GPU smoke check of `pipeforge train` (run by hand on a CUDA machine with a
# pip torch): one rank on cuda:0 holding two stages (Interleaved1F1B), stop
# and resume, export, and the exported model loaded by Python on the GPU.
# Usage: tests/train/gpu_smoke.sh [BUILD_DIR]   (configures and builds it)
set -euo pipefail
BUILD=${1:-build-gpu}
PY=$(command -v python3)
PREFIX=$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DPIPEFORGE_PYTHON="$PY" \
  -DPIPEFORGE_BUILD_TESTS=ON -DPIPEFORGE_BUILD_BENCH=OFF -DPIPEFORGE_WITH_GRAPHVIZ=OFF > "$BUILD.cmake.log" 2>&1 || { tail -30 "$BUILD.cmake.log"; exit 1; }
ninja -C "$BUILD" -k 0 -j"$(nproc)" pipeforge pipeforge_zoo > "$BUILD.ninja.log" 2>&1 || { grep -A6 "error" "$BUILD.ninja.log" | head -80; exit 1; }
OUT=$(mktemp -d /tmp/pf-gpu-XXXX)
cat > "$OUT/gpu.yaml" <<YAML
model: {path: $BUILD/zoo/gpt_demo.pt, num_stages: 2, policy: parameters}
pipeline: {schedule: Interleaved1F1B, microbatches: 4, stages_per_rank: 2}
optimizer: {name: adamw, lr: 3.0e-3, betas: [0.9, 0.95]}
lr_schedule: {warmup_steps: 2}
data: {format: text, path: /usr/share/common-licenses/GPL-3, block_size: 64}
training: {steps: 30, global_batch_size: 16, eval_every: 15}
checkpoint: {dir: $OUT/ckpt, every: 5}
distributed: {device: 'cuda:0'}
output: {dir: $OUT/run, trace: true, log_every: 5}
YAML
"$BUILD/cli/pipeforge" train --config "$OUT/gpu.yaml" --stop-after 10
"$BUILD/cli/pipeforge" train --config "$OUT/gpu.yaml"
"$BUILD/cli/pipeforge" export "$OUT/ckpt" --model "$BUILD/zoo/gpt_demo.pt" --out "$OUT/trained.pt"
$PY - "$OUT/trained.pt" <<'PYEOF'
import sys, torch
m = torch.jit.load(sys.argv[1], map_location="cuda")
assert m.lm_head.weight.data_ptr() == m.wte.weight.data_ptr()
x = torch.randint(0, 256, (2, 64), device="cuda")
print("exported model runs on", m(x).device)
PYEOF
