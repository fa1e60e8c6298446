#!/usr/bin/env bash
# The main job on the embedded default: install, build, split the bundled GPT
# example into 2 stages and train it as a byte-level language model on 2 local
# ranks (Gloo on CPU, 1F1B), then sample from it and draw its curves.
set -euo pipefail
cd "$(dirname "$0")/.."
PIPEFORGE_TARGETS="pipeforge pipeforge_zoo" bash scripts/build.sh
# PIPEFORGE_TORCH=system runs the demo on Debian's LibTorch build instead.
default_dir=build
[ "${PIPEFORGE_TORCH:-wheel}" = system ] && default_dir=build-system
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-$default_dir}
PF="$BUILD_DIR/cli/pipeforge"

echo "== split: the bundled GPT example into 2 stages"
"$PF" split "$BUILD_DIR/zoo/gpt_demo.pt" --spec configs/split_gpt_demo.yaml --out out/demo/stages --force
"$PF" inspect out/demo/stages | tail -n 5

echo "== schedule: 1F1B on 2 ranks, 8 microbatches"
"$PF" schedule --name 1F1B --ranks 2 --stages 2 --microbatches 8 --simulate | tail -n 3

echo "== train: 2 local ranks, Gloo on CPU"
config=configs/demo_gpt.yaml
if [ "$BUILD_DIR" != build ]; then
  # The zoo model this build's torch saved (a newer torch's file may not load in an older LibTorch).
  mkdir -p out/demo
  sed "s|path: build/zoo/|path: $BUILD_DIR/zoo/|" configs/demo_gpt.yaml > out/demo/demo_gpt.yaml
  config=out/demo/demo_gpt.yaml
fi
"$PF" train --config "$config" --nproc 2

echo "== generate: a sample from the trained checkpoint, the stages pipelined on 2 ranks"
"$PF" generate out/demo_gpt/ckpt --model "$BUILD_DIR/zoo/gpt_demo.pt" --prompt "This License" --tokens 240 \
  --temperature 0.8 --top-k 20 --seed 1

echo "== plot: the loss, learning rate, throughput and grad norm curves"
"$PF" plot out/demo_gpt/metrics.jsonl --svg out/demo_gpt/curves.svg
