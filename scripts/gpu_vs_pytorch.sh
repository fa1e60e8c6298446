#!/usr/bin/env bash
# Part of scripts/gpu_check.sh (issue 45): Pipeforge against
# torch.distributed.pipelining on the lent GPU, with bench/vs_pytorch. gpt24
# and the transformers Llama, in fp32 and in bf16, each on 2 ranks sharing
# GPU 0 (NCCL, a host id per rank) with 1F1B and on 1 rank holding both
# stages with ZBVZeroBubble; every row gives both sides' step time, each
# rank's torch.cuda.max_memory_allocated and the ratios. Appends its lines
# to the results file R and leaves each precision's JSON beside it.
#
# Usage (gpu_check.sh sets these): PF=pipeforge PYTHON=python3 R=results.md OUT=DIR ZOO=build/zoo
#   GPU=cuda:0 | cpu   (cpu: a rehearsal of the same rows over Gloo)
#   VS_STEPS=8 VS_TIMEOUT=150 (seconds per precision)
set -uo pipefail
cd "$(dirname "$0")/.."
: "${PF:?set PF to the pipeforge binary}" "${R:?set R to the results file}" "${OUT:?set OUT}"
PYTHON=${PYTHON:-python3}
ZOO=${ZOO:-build/zoo}
GPU=${GPU:-cuda:0}
DEVICE=${GPU%%:*}
STEPS=${VS_STEPS:-8}
LIMIT=${VS_TIMEOUT:-150}
say() { echo "$*" | tee -a "$R"; }
say ""
say "## Pipeforge vs torch.distributed.pipelining on $GPU (bench/vs_pytorch, $STEPS steps, median after 3)"
for precision in fp32 bf16; do
  log="$OUT/vs_pytorch_$precision.log"
  t=$(date +%s)
  # On the CPU (a rehearsal), Pipeforge's ranks still start one by one, as on the GPU.
  VS_PYTORCH_RANKS_BY_HAND=$([ "$DEVICE" = cpu ] && echo 1 || echo 0) timeout "$LIMIT" "$PYTHON" -W ignore::FutureWarning bench/vs_pytorch/vs_pytorch.py --pipeforge "$PF" --zoo "$ZOO" \
    --models gpt24,llama --layouts 2r-1F1B,1r-ZBV --no-best --steps "$STEPS" --warmup 3 --device "$DEVICE" \
    --precision "$precision" --json "$OUT/vs_pytorch_$precision.json" >"$log" 2>&1
  rc=$?
  say "- $precision: exit $rc in $(( $(date +%s) - t )) s"
  # The table (once: the rows are printed as they end and again under "All rows"), and the goals.
  if grep -q "^All rows:" "$log"; then
    sed -n '/^All rows:/,$p' "$log" | sed 's/^/    /' | tee -a "$R"
  else
    grep -E "^(model|gpt24|llama) |max_memory_allocated|PyTorch failed|Error|error" "$log" | tail -20 | sed 's/^/    /' | tee -a "$R"
  fi
done
