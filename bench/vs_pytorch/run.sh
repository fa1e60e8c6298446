#!/usr/bin/env bash
# Pipeforge vs torch.distributed.pipelining, side by side (bench/vs_pytorch/README.md).
#   bash bench/vs_pytorch/run.sh            # every model x layout, then each side's best at 2 and 4 ranks
#                                           # (about an hour on 2 cores; --no-best: about 20 minutes)
#   bash bench/vs_pytorch/run.sh --quick    # smoke run: gpt_demo, 2 ranks, 1F1B + 2r-best
#   bash bench/vs_pytorch/run.sh --models gpt24 --layouts 2r-ZBV --steps 30 --adamw foreach
# Best rows (Pr-best): Pipeforge's own cost split + schedule auto against the fastest of
# PyTorch's named schedules at the same cuts, and the limit of the measured stage costs.
# --adamw loop|foreach|fused (default fused) sets the same AdamW implementation on both sides.
# PIPEFORGE (default build/cli/pipeforge) and PYTHON (default .venv/bin/python,
# the torch the main build links) choose the two sides.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PIPEFORGE=${PIPEFORGE:-build/cli/pipeforge}
PYTHON=${PYTHON:-.venv/bin/python}
if [[ ! -x $PYTHON ]]; then
  echo "run.sh: no Python at $PYTHON; run scripts/install-deps.sh or set PYTHON" >&2
  exit 1
fi
exec "$PYTHON" -W ignore::FutureWarning bench/vs_pytorch/vs_pytorch.py --pipeforge "$PIPEFORGE" "$@"
