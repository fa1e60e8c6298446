#!/usr/bin/env bash
# Scripts GPT models of 12, 48 and 96 blocks and runs the split benchmark on them.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-build}
cmake --build "$BUILD_DIR" --target pipeforge_bench_split >/dev/null
models=()
for layers in 12 48 96; do
  dir="$BUILD_DIR/bench-zoo/gpt$layers"
  /usr/bin/python3 tests/models/generate_zoo.py --out "$dir" --models gpt --gpt-layers "$layers"
  cp "$dir/gpt.pt" "$BUILD_DIR/bench-zoo/gpt_${layers}layers.pt"
  models+=("$BUILD_DIR/bench-zoo/gpt_${layers}layers.pt")
done
"$BUILD_DIR/bench/pipeforge_bench_split" "${models[@]}"
