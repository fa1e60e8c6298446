#!/usr/bin/env bash
# The main job on the embedded default: install, build, build a stock
# transformers Llama (random init) and export it with torch.export, split it
# into 2 stages and train it as a byte-level language model on 2 local ranks
# (Gloo on CPU, 1F1B), then sample from it and draw its curves.
#
# PIPEFORGE_DEMO=gpt runs the second example instead: the bundled TorchScript
# GPT (tests/models/generate_zoo.py's gpt_demo), the same job. The system
# build (PIPEFORGE_TORCH=system, Debian's torch 1.13, which has no
# torch.export) always runs that one.
set -euo pipefail
cd "$(dirname "$0")/.."
default_dir=build
[ "${PIPEFORGE_TORCH:-wheel}" = system ] && default_dir=build-system
BUILD_DIR=${PIPEFORGE_BUILD_DIR:-$default_dir}
PF="$BUILD_DIR/cli/pipeforge"
demo=${PIPEFORGE_DEMO:-llama}
[ "${PIPEFORGE_TORCH:-wheel}" = system ] && demo=gpt
case "$demo" in
  llama | gpt) ;;
  *) echo "pipeforge: PIPEFORGE_DEMO is '$demo'; use llama or gpt" >&2; exit 2 ;;
esac

if [ "$demo" = llama ]; then
  PIPEFORGE_TARGETS="pipeforge" bash scripts/build.sh
  PYTHON=${PIPEFORGE_VENV:-.venv}/bin/python
  model=out/demo_llama/llama.pt2
  echo "== export: a transformers LlamaForCausalLM (random init) with torch.export, batch and sequence dynamic"
  "$PYTHON" scripts/make_demo_llama.py "$model" 2> >(grep -v "^W[0-9]" >&2)

  echo "== split: at its middle decoder layer, into 2 stages"
  printf 'split_points:\n  model.layers.2: BEGINNING\n' > out/demo_llama/split.yaml
  "$PF" split "$model" --spec out/demo_llama/split.yaml --out out/demo_llama/stages --force
  "$PF" inspect out/demo_llama/stages | tail -n 5

  echo "== schedule: 1F1B on 2 ranks, 4 microbatches"
  "$PF" schedule --name 1F1B --ranks 2 --stages 2 --microbatches 4 --simulate | tail -n 3

  echo "== train: 2 local ranks, Gloo on CPU"
  "$PF" train --config configs/demo_llama.yaml --nproc 2

  echo "== generate: a sample from the trained checkpoint, the stages pipelined on 2 ranks"
  "$PF" generate out/demo_llama/ckpt --model "$model" --prompt "This License" --tokens 240 \
    --temperature 0.8 --top-k 20 --seed 1

  echo "== plot: the loss, learning rate, throughput and grad norm curves"
  "$PF" plot out/demo_llama/metrics.jsonl --svg out/demo_llama/curves.svg
  exit 0
fi

PIPEFORGE_TARGETS="pipeforge pipeforge_zoo" bash scripts/build.sh
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
